"""Model names on the command line (``--model nsac``) → controllers, from one dataclass config.

:func:`register_model` adds a head under a new name (the Python API; the CLI offers the built-in ones)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from nsacdrive.controllers.baselines import EnsembleController, EvidentialHead, MCDropoutHead, SDENetHead
from nsacdrive.controllers.controller import Controller
from nsacdrive.controllers.encoders import make_encoder
from nsacdrive.controllers.heads import GMLEHead, LevyHead, NACRegressionHead, NSACHead, UncertaintyHead
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.model_names import REGISTERED_MODEL_NAMES
from nsacdrive.controllers.objectives import NSACObjective


def _nsac(config: ModelConfig) -> UncertaintyHead:
    objective = NSACObjective(lambda_reg=config.lambda_reg, beta=config.nll_beta, regulariser=config.epistemic_regulariser,
                              margin=config.epistemic_margin, censored_pedals=config.pedal_likelihood == "censored")
    return NSACHead(config.nsac_config(), config.train_samples, objective)


def _gmle(config: ModelConfig) -> UncertaintyHead:
    return GMLEHead(config.nac_config(), config.nll_beta, censored_pedals=config.pedal_likelihood == "censored")


def _mcdropout(config: ModelConfig) -> UncertaintyHead:
    return MCDropoutHead(config.nac_config(dropout=config.dropout), config.dropout, config.train_samples, config.nll_beta)


def _ensemble(config: ModelConfig) -> UncertaintyHead:
    raise ValueError("'ensemble' is M whole controllers (encoders + heads), not a head: build it with "
                     "build_controller(config), which returns an EnsembleController")


def _evidential(config: ModelConfig) -> UncertaintyHead:
    return EvidentialHead(config.nac_config(), config.evidential_coeff)


def _sdenet(config: ModelConfig) -> UncertaintyHead:
    return SDENetHead(config.encoder.token_dim, config.d_model, config.sde_depth, config.sde_sigma_max, config.nll_beta)


def _nac(config: ModelConfig) -> UncertaintyHead:
    return NACRegressionHead(config.nac_config())


def _levy(config: ModelConfig) -> UncertaintyHead:
    # one learned identity per token slot: frame × the encoder's tokens per frame
    return LevyHead(config.encoder.token_dim, config.levy_frames * config.encoder.tokens_per_frame, window=config.levy_window,
                    sharpness=config.levy_sharpness, nll_beta=config.nll_beta)


#: Builds a head from the model config (its encoder's ``token_dim`` is the width of the tokens it reads).
HeadBuilder = Callable[[ModelConfig], UncertaintyHead]

MODEL_BUILDERS: dict[str, HeadBuilder] = {
    "nsac": _nsac,
    "gmle": _gmle,
    "nac": _nac,
    "levy": _levy,
    "mcdropout": _mcdropout,
    "ensemble": _ensemble,
    "evidential": _evidential,
    "sdenet": _sdenet,
}


def register_model(name: str, builder: HeadBuilder) -> None:
    """Add model ``name``, whose head ``builder(config)`` builds; :func:`build_controller` puts it
    behind the config's encoder. The name becomes valid in :class:`ModelConfig`, so training,
    evaluation and :func:`nsacdrive.controllers.run.load_run` accept it, in this process only."""
    if not name:
        raise ValueError("model: a name must be non-empty")
    if name in MODEL_BUILDERS:
        raise ValueError(f"model {name!r} is already registered")
    MODEL_BUILDERS[name] = builder
    REGISTERED_MODEL_NAMES.append(name)


def build_controller(config: ModelConfig) -> nn.Module:
    """A fresh, randomly initialised controller (seed the global RNG first for determinism)."""
    if config.model == "ensemble":
        return EnsembleController(config)
    return Controller(make_encoder(config.encoder), MODEL_BUILDERS[config.model](config), config.encoder.token_dim,
                      config.speed_input)
