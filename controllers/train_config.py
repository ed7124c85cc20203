"""The settings of one training run (``config.json`` of a run folder), apart from the trainer that reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nsacdrive.common.config_checks import COUNT, NON_NEGATIVE, POSITIVE, Range, check_fields, config_from_dict
from nsacdrive.common.devices import check_device_name
from nsacdrive.controllers.augment import AugmentConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.ood_proxies import PERTURBATIONS
from nsacdrive.controllers.precision import PRECISIONS
from nsacdrive.controllers.robust_augment import RobustAugmentConfig
from nsacdrive.controllers.udacity_augment import UdacityAugmentConfig
from nsacdrive.data_collection.dataset import SeedSplit, is_udacity_data
from nsacdrive.envs.colours import validate_preset

#: the numbers TrainConfig's numeric fields may take (their types come from the annotations)
RANGES = {
    **dict.fromkeys(("sequence_length", "frame_stride", "batch_size", "epochs", "max_batches_per_epoch", "min_batches_per_epoch",
                     "max_val_batches", "early_stopping_patience", "cache_episodes", "robust_members"), COUNT),
    **dict.fromkeys(("lr", "grad_clip"), POSITIVE),
    "twin_fraction": Range(0, 1, low_open=True),
    **dict.fromkeys(("weight_decay", "plateau_patience", "perturb_std", "consistency"), NON_NEGATIVE),
    **dict.fromkeys(("plateau_factor", "ema_decay"), Range(0, 1, low_open=True, high_open=True)),  # ReduceLROnPlateau needs 0 < factor < 1; a decay of 0 or 1 averages nothing
    "seed": Range(0, 2**63 - 1),  # numpy SeedSequence needs >= 0, torch.manual_seed < 2**64
}


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
    min_batches_per_epoch: int | None = None  # smaller training splits are visited several times per epoch (the max still caps)
    max_val_batches: int | None = None
    lr: float = 1e-3
    weight_decay: float = 1e-4
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    early_stopping_patience: int = 5
    grad_clip: float = 10.0
    ema_decay: float | None = None  # Polyak averaging: validate and publish the weights' per-step EMA (None: the raw weights)
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # colour, every observation kind (batched)
    udacity_augment: UdacityAugmentConfig = field(default_factory=UdacityAugmentConfig)  # Udacity observations
    robust_augment: RobustAugmentConfig = field(default_factory=RobustAugmentConfig)  # geometric, photometric, random convolution (batched)
    consistency: float = 0.0  # weight of the token consistency between each sequence's clean and augmented views (0: off)
    robust_members: int | None = None  # ensembles: only the first N members train on robust_augment, the rest on colour alone (None: all)
    perturb_mean: float = 0.0  # μ_pert, preprocessed-image units ([0, 1] CarRacing, [−1, 1] Udacity)
    perturb_std: float = 0.2  # σ_pert, preprocessed-image units
    perturbation: str = "noise"  # NSAC/SDE-Net's perturbed twins: noise | proxies (controllers/ood_proxies.py)
    twin_fraction: float = 1.0  # the share of each batch that gets a perturbed twin (its encoder pass costs that much)
    cache_episodes: int = 8
    seed: int = 0
    device: str = "auto"
    precision: str = "float32"  # the encoder's convolutions in training: float32 | bfloat16 (autocast; docs/guide/train.md: when it pays)
    init_from: str | None = None  # a run folder whose best weights initialise this run (fine-tuning, DAgger)

    def __post_init__(self) -> None:
        if isinstance(self.model, dict) and isinstance(self.data, str) and is_udacity_data(self.data):
            object.__setattr__(self, "model", ModelConfig.from_dict({"observation": "udacity", **self.model}))
        check_fields(self, "training config", RANGES)
        if is_udacity_data(self.data) and self.model.observation != "udacity":
            raise ValueError(f"data {self.data!r} is Udacity data, but model.observation is {self.model.observation!r}; "
                             "set it to 'udacity' (or leave it out)")
        if self.model.model == "levy" and self.model.levy_frames != self.sequence_length:
            raise ValueError(f"levy_frames ({self.model.levy_frames}) must equal sequence_length ({self.sequence_length})")
        self._check_split()
        self._check_presets()
        self._check_robust_members()
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"training config perturbation must be one of {', '.join(PERTURBATIONS)}, got {self.perturbation!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"training config precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        check_device_name(self.device, "training config device")

    def _check_split(self) -> None:
        """Explicit seed ranges must be disjoint (a validation or test track the model trained on
        would score as held out); ``auto`` (all three) is split disjointly from the dataset later."""
        ranges = (self.train_seeds, self.val_seeds, self.test_seeds)
        if "auto" in ranges:
            if set(ranges) != {"auto"}:
                raise ValueError(f"training config train_seeds/val_seeds/test_seeds: give all three ranges or none ('auto'), "
                                 f"got {ranges}")
            return
        SeedSplit.parse(*ranges)

    def _check_robust_members(self) -> None:
        """``robust_members`` splits an ensemble in two, so it needs an ensemble, robust augmentation
        and members on both sides."""
        if self.robust_members is None:
            return
        if self.model.model != "ensemble":
            raise ValueError(f"training config robust_members applies to ensembles only, but model.model is {self.model.model!r}; "
                             "leave it out for this model")
        if not self.robust_augment.enabled:
            raise ValueError("training config robust_members needs robust_augment.probability > 0 (there is nothing to split)")
        if self.robust_members >= self.model.members:
            raise ValueError(f"training config robust_members must be below model.members ({self.model.members}) so that "
                             f"some members train without robust augmentation, got {self.robust_members}")

    def _check_presets(self) -> None:
        if not self.train_presets:
            raise ValueError("training config train_presets must name at least one colour preset, got []")
        for preset in self.train_presets:
            try:
                validate_preset(preset)
            except ValueError as exc:
                raise ValueError(f"training config train_presets: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_model(self, name: str) -> TrainConfig:
        """This recipe with the model ``name`` (the other model fields kept), as ``sweep --models`` trains it."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, model=name))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return config_from_dict(cls, data, "training config")
