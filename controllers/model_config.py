"""The architecture settings of a controller (saved beside every checkpoint), apart from the builders."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.nsac import NACConfig, NSACConfig
from nsacdrive.envs.observation_kinds import DEFAULT_FRAME_KIND, observation_kind

#: The heads ``model`` may name; :data:`nsacdrive.controllers.registry.MODEL_BUILDERS` builds each one.
MODEL_NAMES = ("nsac", "gmle", "nac", "levy", "mcdropout", "ensemble", "evidential", "sdenet")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a controller's architecture (saved beside every checkpoint)."""

    model: str = "nsac"
    encoder: EncoderConfig = None  # type: ignore[assignment]  # None → the observation kind's default encoder
    d_model: int = 64
    num_heads: int = 16
    topk: int = 8
    mode: str = "corrected"  # NSAC/NAC: corrected | reference
    bn_std: float | None = None  # NSAC logit noise scale (None: 1.0 corrected, 0.1 reference)
    train_samples: int = 5  # MC draws per training step (NSAC, MC-Dropout)
    predict_samples: int = 20  # MC draws at prediction (NSAC, MC-Dropout, SDE-Net)
    lambda_reg: float = 0.5  # NSAC epistemic regulariser weight
    dropout: float = 0.1  # MC-Dropout rate
    members: int = 5  # Deep Ensemble size
    evidential_coeff: float = 0.01  # Deep Evidential Regression regulariser coefficient
    sde_depth: int = 6  # SDE-Net Euler steps
    sde_sigma_max: float = 0.5  # SDE-Net diffusion scale
    levy_frames: int = 4  # Lévy: frame slots with a learned identity (must equal the sequence length)
    levy_window: float = 0.5  # Lévy: seconds of history mapped onto the index-space time axis [0, 1]
    speed_input: bool = False  # add the measured forward speed to every frame token (controllers/controller.py)
    observation: str = DEFAULT_FRAME_KIND  # frames and preprocessing (envs/observation_kinds.py): carracing | udacity

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES:
            raise ValueError(f"--model: unknown model {self.model!r}; expected one of {', '.join(sorted(MODEL_NAMES))}")
        kind = observation_kind(self.observation, "model config 'observation'")
        if self.encoder is None:
            object.__setattr__(self, "encoder", EncoderConfig(kind=kind.default_encoder))
        if isinstance(self.encoder, dict):
            object.__setattr__(self, "encoder", EncoderConfig(**{**self.encoder, "channels": tuple(self.encoder.get("channels", (32, 64, 64)))}))
        if self.encoder.frame_shape != kind.frame_shape:
            raise ValueError(f"model config: encoder kind {self.encoder.kind!r} reads frames {self.encoder.frame_shape}, but observation "
                             f"{self.observation!r} gives {kind.frame_shape}; use encoder kind {kind.default_encoder!r} "
                             "(or another encoder for that observation)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model config: unknown fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def nsac_config(self) -> NSACConfig:
        return NSACConfig(input_dim=self.encoder.token_dim, d_model=self.d_model, num_heads=self.num_heads,
                          topk=self.topk, mode=self.mode, bn_std=self.bn_std, output_dim=len(ACTION_NAMES))  # type: ignore[arg-type]

    def nac_config(self, dropout: float = 0.0) -> NACConfig:
        return NACConfig(input_dim=self.encoder.token_dim, d_model=self.d_model, num_heads=self.num_heads,
                         topk=self.topk, mode=self.mode, dropout=dropout)  # type: ignore[arg-type]
