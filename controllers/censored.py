"""The censored-Gaussian pedal likelihood: gas and brake as a latent Gaussian clipped to [0, 1].

Expert pedals sit exactly on the box's edges most of the time (on the quality data: brake is
exactly 0 in 88 % of steps, gas 0 in 15 % and 1 in 8 %). A Gaussian on [0, 1] puts mass outside
the box and cannot put a point mass on an edge, so it is miscalibrated there by construction.
With ``pedal_likelihood: "censored"`` (Tobit regression) a pedal is y = clip(y*, 0, 1) with the
latent y* ~ N(μ, σ²), whose likelihood is

    P(y = 0) = Φ(−μ/σ),   P(y = 1) = Φ((μ − 1)/σ),   p(y) = N(y; μ, σ²) for 0 < y < 1.

The latent mean lives in (−½, 3/2) (:func:`squash_latent`) so either edge can carry nearly all
the mass while the epistemic spread stays in action units. Predictions are reported in action
space — the mean and variance of the clipped variable, per draw, combined by the law of total
variance (:func:`observed_moments`) — so drivers, logs and every Gaussian metric read them as
they read any head's; ``UncertainPrediction.latent_mean`` / ``latent_variance`` keep the
latent Gaussian for the censored scores of :mod:`nsacdrive.controllers.metrics`. Steering is
not censored (it is tanh-squashed and rarely at ±1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nsacdrive.controllers.actions import ACTION_NAMES, squash
from nsacdrive.controllers.prediction import UncertainPrediction, draw_spread

PEDAL_LIKELIHOODS = ("gaussian", "censored")
#: the actions the censored likelihood clips to [0, 1] (gas, brake)
CENSORED_ACTIONS = torch.tensor([False, True, True])
LATENT_LOW, LATENT_HIGH = -0.5, 1.5
_LOG_2PI = math.log(2 * math.pi)
_SQRT_2PI = math.sqrt(2 * math.pi)


def squash_latent(raw: torch.Tensor) -> torch.Tensor:
    """Raw head means [..., 3] → tanh steer and latent pedal means in (LATENT_LOW, LATENT_HIGH)."""
    if raw.shape[-1] != len(ACTION_NAMES):
        raise ValueError(f"expected {len(ACTION_NAMES)} action outputs in the last axis, got {raw.shape[-1]}")
    pedals = LATENT_LOW + (LATENT_HIGH - LATENT_LOW) * torch.sigmoid(raw[..., 1:])
    return torch.cat([torch.tanh(raw[..., :1]), pedals], dim=-1)


def to_action_box(censored_pedals: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The squash of a head's raw means: into the box (:func:`~nsacdrive.controllers.actions.squash`), or
    with latent pedal means (:func:`squash_latent`) for the censored likelihood."""
    return squash_latent if censored_pedals else squash


def action_nll(mean: torch.Tensor, variance: torch.Tensor, target: torch.Tensor, censored_pedals: bool) -> torch.Tensor:
    """Elementwise NLL [..., 3]: Gaussian for every action, or with the pedals censored (:func:`censored_nll`)."""
    if censored_pedals:
        return censored_nll(mean, variance, target)
    return 0.5 * (_LOG_2PI + torch.log(variance) + (target - mean).square() / variance)


def censored_nll(mean: torch.Tensor, variance: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Elementwise NLL [..., 3]: Gaussian for steer, censored at 0 and 1 for the pedals."""
    std = variance.sqrt()
    gaussian = action_nll(mean, variance, target, censored_pedals=False)
    at_low = -torch.special.log_ndtr(-mean / std)
    at_high = -torch.special.log_ndtr((mean - 1) / std)
    censored = CENSORED_ACTIONS.to(target.device)
    pedal = torch.where(target <= 0, at_low, torch.where(target >= 1, at_high, gaussian))
    return torch.where(censored, pedal, gaussian)


def clipped_moments(mean: torch.Tensor, variance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of clip(Y, 0, 1) for Y ~ N(mean, variance), elementwise (closed form)."""
    std = variance.sqrt()
    lo, hi = -mean / std, (1 - mean) / std
    cdf_lo, cdf_hi = torch.special.ndtr(lo), torch.special.ndtr(hi)
    pdf_lo, pdf_hi = torch.exp(-0.5 * lo.square()) / _SQRT_2PI, torch.exp(-0.5 * hi.square()) / _SQRT_2PI
    inside = cdf_hi - cdf_lo
    first = mean * inside + std * (pdf_lo - pdf_hi) + (1 - cdf_hi)
    middle_second = (mean.square() + variance) * inside + 2 * mean * std * (pdf_lo - pdf_hi) + variance * (lo * pdf_lo - hi * pdf_hi)
    second = middle_second + (1 - cdf_hi)
    return first, (second - first.square()).clamp_min(0.0)


def observed_moments(mean_draws: torch.Tensor, variance_draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-draw latent Gaussians [S, B, 3] → action-space (mean, aleatoric, epistemic) [B, 3].

    Pedals: each draw's clipped moments, then mean = E_s m_s, aleatoric = E_s v_s, epistemic =
    Var_s m_s (the law of total variance on the clipped variable). Steer: the Gaussian's own."""
    m, v = clipped_moments(mean_draws, variance_draws)
    censored = CENSORED_ACTIONS.to(mean_draws.device)
    m, v = torch.where(censored, m, mean_draws), torch.where(censored, v, variance_draws)
    return m.mean(0), v.mean(0), draw_spread(m)


def latent_moments(mean_draws: torch.Tensor, variance_draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The moment-matched latent Gaussian over draws [S, B, 3] → (mean, variance) [B, 3]."""
    return mean_draws.mean(0), variance_draws.mean(0) + draw_spread(mean_draws)


def censored_prediction(mean_draws: torch.Tensor, variance_draws: torch.Tensor) -> UncertainPrediction:
    """Per-draw latent Gaussians [S, B, 3] → the action-space prediction, latent Gaussian attached."""
    mean, aleatoric, epistemic = observed_moments(mean_draws, variance_draws)
    latent_mean, latent_variance = latent_moments(mean_draws, variance_draws)
    return UncertainPrediction(mean, aleatoric, epistemic, latent_mean=latent_mean, latent_variance=latent_variance)
