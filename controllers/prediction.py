"""What every controller head predicts: per-output mean with aleatoric and epistemic variance."""

from __future__ import annotations

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

    @property
    def total(self) -> torch.Tensor:
        return self.aleatoric + self.epistemic

    @classmethod
    def cat(cls, parts: Sequence[UncertainPrediction]) -> UncertainPrediction:
        """Predictions of consecutive batch rows → one prediction (rows in order)."""
        def cat(name: str) -> torch.Tensor | None:
            return None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts])

        signals = None if parts[0].signals is None else {key: torch.cat([p.signals[key] for p in parts]) for key in parts[0].signals}
        return cls(*(cat(name) for name in ("mean", "aleatoric", "epistemic", "attention", "density")), signals,  # type: ignore[arg-type]
                   cat("latent_mean"), cat("latent_variance"))


def decompose(mean_draws: torch.Tensor, log_sigma_draws: torch.Tensor, variance_floor: float = 0.0) -> UncertainPrediction:
    """Moments over the draw axis 0 (law of total variance): epistemic = Var(μ_s), aleatoric = E[e^{2ℓ_s} + floor].

    ``variance_floor``: the constant a head's loss adds to every variance (NSAC's ε), so that the
    reported aleatoric variance is the one the loss was computed with."""
    mean = mean_draws.mean(0)
    epistemic = mean_draws.var(0, unbiased=False) if mean_draws.shape[0] > 1 else torch.zeros_like(mean)
    return UncertainPrediction(mean, torch.exp(2 * log_sigma_draws).mean(0) + variance_floor, epistemic)
