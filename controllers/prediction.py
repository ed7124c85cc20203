"""What every controller head predicts: per-output mean with aleatoric and epistemic variance."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class UncertainPrediction:
    """Predictive moments per output: mean, aleatoric and epistemic variance (total = sum)."""

    mean: torch.Tensor
    aleatoric: torch.Tensor
    epistemic: torch.Tensor
    #: [B, T] attention of the newest query on each input position (mean over draws and heads;
    #: a summary for closed-loop logs), from heads that attend over the sequence; else None
    attention: torch.Tensor | None = None
    #: [B] feature-density score of the input (:mod:`nsacdrive.controllers.density`) when the run has one; else None
    density: torch.Tensor | None = None
    #: head-specific uncertainty signals, each [B, A] (Lévy attention: ``evidence`` Λ, ``disagreement``
    #: trΣ_V and ``deviation`` σ̂ of each action's query), or None
    signals: dict[str, torch.Tensor] | None = None
    #: [B, A] each, heads trained with the censored pedal likelihood (:mod:`nsacdrive.controllers.censored`):
    #: the moment-matched latent Gaussian before the box clips the pedals (mean and variance above are
    #: the clipped variable's); None otherwise
    latent_mean: torch.Tensor | None = None
    latent_variance: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> UncertainPrediction:
        """This prediction with every tensor on ``device``."""
        def move(value: torch.Tensor | dict[str, torch.Tensor] | None) -> torch.Tensor | dict[str, torch.Tensor] | None:
            if isinstance(value, dict):
                return {key: tensor.to(device) for key, tensor in value.items()}
            return None if value is None else value.to(device)

        return type(self)(**{field.name: move(getattr(self, field.name)) for field in dataclasses.fields(self)})

    @property
    def total(self) -> torch.Tensor:
        return self.aleatoric + self.epistemic

    @classmethod
    def cat(cls, parts: Sequence[UncertainPrediction]) -> UncertainPrediction:
        """Predictions of consecutive batch rows → one prediction (rows in order)."""
        def cat(name: str) -> torch.Tensor | dict[str, torch.Tensor] | None:
            first = getattr(parts[0], name)
            if first is None:
                return None
            if isinstance(first, dict):  # signals: one tensor per key
                return {key: torch.cat([getattr(p, name)[key] for p in parts]) for key in first}
            return torch.cat([getattr(p, name) for p in parts])

        return cls(**{field.name: cat(field.name) for field in dataclasses.fields(cls)})  # type: ignore[arg-type]


def decompose(mean_draws: torch.Tensor, log_sigma_draws: torch.Tensor, variance_floor: float = 0.0) -> UncertainPrediction:
    """Moments over the draw axis 0 (law of total variance): epistemic = Var(μ_s), aleatoric = E[e^{2ℓ_s} + floor].

    ``variance_floor``: the constant a head's loss adds to every variance (NSAC's ε), so that the
    reported aleatoric variance is the one the loss was computed with."""
    return UncertainPrediction(mean_draws.mean(0), torch.exp(2 * log_sigma_draws).mean(0) + variance_floor, draw_spread(mean_draws))


def draw_spread(draws: torch.Tensor) -> torch.Tensor:
    """Var over the draw axis 0 (population), or zeros for a single draw."""
    return draws.var(0, unbiased=False) if draws.shape[0] > 1 else torch.zeros_like(draws[0])
