"""The settings of one training run (``config.json`` of a run folder), apart from the trainer that reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nsacdrive.controllers.augment import AugmentConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.udacity_augment import UdacityAugmentConfig
from nsacdrive.data_collection.dataset import is_udacity_data


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (saved as ``config.json`` in the run folder)."""

    data: str
    model: ModelConfig = field(default_factory=ModelConfig)
    train_seeds: str = "auto"  # "auto": 80/10/10 % of the dataset's track seeds, in order
    val_seeds: str = "auto"
    test_seeds: str = "auto"
    train_presets: tuple[str, ...] = ("default",)  # colour presets trained on; others stay out of distribution
    sequence_length: int = 4
    frame_stride: int = 2
    batch_size: int = 64
    epochs: int = 20
    max_batches_per_epoch: int | None = None
    max_val_batches: int | None = None
    lr: float = 1e-3
    weight_decay: float = 1e-4
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    early_stopping_patience: int = 5
    grad_clip: float = 10.0
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # CarRacing observations
    udacity_augment: UdacityAugmentConfig = field(default_factory=UdacityAugmentConfig)  # Udacity observations
    perturb_mean: float = 0.0  # μ_pert, preprocessed-image units ([0, 1] CarRacing, [−1, 1] Udacity)
    perturb_std: float = 0.2  # σ_pert, preprocessed-image units
    cache_episodes: int = 8
    seed: int = 0
    device: str = "auto"
    init_from: str | None = None  # a run folder whose best weights initialise this run (fine-tuning, DAgger)

    def __post_init__(self) -> None:
        udacity_data = is_udacity_data(self.data)
        if isinstance(self.model, dict):
            model = {"observation": "udacity", **self.model} if udacity_data else self.model
            object.__setattr__(self, "model", ModelConfig.from_dict(model))
        if udacity_data and self.model.observation != "udacity":
            raise ValueError(f"data {self.data!r} is Udacity data, but model.observation is {self.model.observation!r}; "
                             "set it to 'udacity' (or leave it out)")
        object.__setattr__(self, "train_presets", tuple(self.train_presets))
        if isinstance(self.augment, dict):
            object.__setattr__(self, "augment", AugmentConfig(**self.augment))
        if isinstance(self.udacity_augment, dict):
            object.__setattr__(self, "udacity_augment", UdacityAugmentConfig(**self.udacity_augment))
        for name in ("sequence_length", "frame_stride", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.model.model == "levy" and self.model.levy_frames != self.sequence_length:
            raise ValueError(f"levy_frames ({self.model.levy_frames}) must equal sequence_length ({self.sequence_length})")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"training config: unknown fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)
