"""The architecture settings of a controller (saved beside every checkpoint), apart from the builders."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nsacdrive.common.config_checks import (
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL,
    WIDTH,
    Range,
    check_fields,
    config_from_dict,
)
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.censored import PEDAL_LIKELIHOODS
from nsacdrive.controllers.circuit_attention import Mode
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.levy import MAX_SHARPNESS
from nsacdrive.controllers.model_names import model_names  # the heads ``model`` may name
from nsacdrive.controllers.nsac import NACConfig, NSACConfig
from nsacdrive.controllers.objectives import REGULARISERS
from nsacdrive.envs.front_camera import HORIZONTAL_FOV
from nsacdrive.envs.observation_kinds import DEFAULT_FRAME_KIND, camera_fov_for, observation_kind

#: the numbers ModelConfig's numeric fields may take (their types come from the annotations)
RANGES = {
    **dict.fromkeys(("d_model", "num_heads", "topk", "train_samples", "predict_samples", "members", "sde_depth", "levy_frames"),
                    WIDTH),
    **dict.fromkeys(("bn_std", "lambda_reg", "epistemic_margin", "evidential_coeff", "sde_sigma_max"), NON_NEGATIVE),
    "levy_window": POSITIVE,
    "levy_sharpness": Range(0, MAX_SHARPNESS, low_open=True),
    "dropout": Range(0, 1, high_open=True),
    "nll_beta": UNIT_INTERVAL,
    "camera_fov": HORIZONTAL_FOV,
}
#: settings of the loss and of the MC draws that shape no weight: a run may start from another's
#: weights (``init_from``) with other values of these, e.g. to fine-tune with β-NLL
OBJECTIVE_FIELDS = ("train_samples", "predict_samples", "lambda_reg", "epistemic_regulariser", "epistemic_margin",
                    "evidential_coeff", "nll_beta")
#: heads that can train the censored pedal likelihood
CENSORED_MODELS = ("nsac", "gmle")
#: heads whose loss is not a Gaussian likelihood, so β-NLL has nothing to weight
NO_NLL_BETA = ("evidential", "nac")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a controller's architecture (saved beside every checkpoint)."""

    model: str = "nsac"
    encoder: EncoderConfig | None = None  # None → the observation kind's default encoder (set in __post_init__)
    d_model: int = 64
    num_heads: int = 16
    topk: int = 8
    mode: Mode = "corrected"  # NSAC/NAC key selection: corrected | reference
    bn_std: float | None = None  # NSAC logit noise scale (None: 1.0 corrected, 0.1 reference)
    train_samples: int = 5  # MC draws per training step (NSAC, MC-Dropout)
    predict_samples: int = 20  # MC draws at prediction (NSAC, MC-Dropout, SDE-Net)
    lambda_reg: float = 0.5  # NSAC epistemic regulariser weight
    epistemic_regulariser: str = "ratio"  # NSAC: ratio (published) | hinge (controllers/objectives.py)
    epistemic_margin: float = 0.05  # NSAC hinge margin: RMS spread, action units
    dropout: float = 0.1  # MC-Dropout rate
    members: int = 5  # Deep Ensemble size
    evidential_coeff: float = 0.01  # Deep Evidential Regression regulariser coefficient
    sde_depth: int = 6  # SDE-Net Euler steps
    sde_sigma_max: float = 0.5  # SDE-Net diffusion scale
    levy_frames: int = 4  # Lévy: frame slots with a learned identity (must equal the sequence length)
    levy_window: float = 0.5  # Lévy: seconds of history mapped onto the index-space time axis [0, 1]
    levy_sharpness: float = 1.0  # Lévy: the kernel's fixed β in exp(β·cos(q, k)) (docs/levy.md#kernel; the paper's 1, 4, 10)
    pedal_likelihood: str = "gaussian"  # nsac, gmle: gaussian | censored (gas/brake clipped to [0, 1]; controllers/censored.py)
    nll_beta: float = 0.0  # β-NLL: weight each action's likelihood term by its variance^β (0 = plain NLL; objectives.py)
    speed_input: bool = False  # add the measured forward speed to every frame token (controllers/controller.py)
    observation: str = DEFAULT_FRAME_KIND  # frames and preprocessing (envs/observation_kinds.py): carracing | udacity
    camera_fov: float | None = None  # udacity: the front camera's horizontal field of view, degrees (None: the simulator's 65)

    def __post_init__(self) -> None:
        check_fields(self, "model config", RANGES)
        kind = observation_kind(self.observation, "model config 'observation'")
        if self.encoder is None:
            object.__setattr__(self, "encoder", EncoderConfig(kind=kind.default_encoder))
        object.__setattr__(self, "camera_fov", camera_fov_for(kind.name, self.camera_fov, "model config 'camera_fov'"))
        if self.model not in model_names():
            raise ValueError(f"model config: unknown model {self.model!r}; expected one of {', '.join(sorted(model_names()))}")
        if self.epistemic_regulariser not in REGULARISERS:
            raise ValueError(f"model config: epistemic_regulariser must be one of {', '.join(REGULARISERS)}, "
                             f"got {self.epistemic_regulariser!r}")
        if self.pedal_likelihood not in PEDAL_LIKELIHOODS:
            raise ValueError(f"model config: pedal_likelihood must be one of {', '.join(PEDAL_LIKELIHOODS)}, got {self.pedal_likelihood!r}")
        if self.pedal_likelihood == "censored" and self.model not in CENSORED_MODELS:
            raise ValueError(f"model config: the censored pedal likelihood is implemented for {', '.join(CENSORED_MODELS)}, "
                             f"not {self.model!r}; leave pedal_likelihood at 'gaussian'")
        if self.nll_beta and self.model in NO_NLL_BETA:
            raise ValueError(f"model config: nll_beta weights a Gaussian likelihood; {self.model!r} trains another loss, leave nll_beta at 0")
        if self.encoder.frame_shape != kind.frame_shape:
            raise ValueError(f"model config: encoder kind {self.encoder.kind!r} reads frames {self.encoder.frame_shape}, but observation "
                             f"{self.observation!r} gives {kind.frame_shape}; use encoder kind {kind.default_encoder!r} "
                             "(or another encoder for that observation)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def architecture(self) -> dict[str, Any]:
        """The settings that define the weights and how they act: all but :data:`OBJECTIVE_FIELDS`."""
        return {name: value for name, value in self.to_dict().items() if name not in OBJECTIVE_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        return config_from_dict(cls, data, "model config")

    def nsac_config(self) -> NSACConfig:
        return NSACConfig(input_dim=self.encoder.token_dim, d_model=self.d_model, num_heads=self.num_heads,
                          topk=self.topk, mode=self.mode, bn_std=self.bn_std, output_dim=len(ACTION_NAMES))

    def nac_config(self, dropout: float = 0.0) -> NACConfig:
        return NACConfig(input_dim=self.encoder.token_dim, d_model=self.d_model, num_heads=self.num_heads,
                         topk=self.topk, mode=self.mode, dropout=dropout)
