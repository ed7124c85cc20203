"""Training objectives for heads that predict (μ, log σ), and the NSAC two-term objective.

NSAC objective (docs/nsac.md#training-objective), with S draws (μ_s, ℓ_s) on clean inputs and
(μ̃_s, ℓ̃_s) on perturbed inputs:

    L_nll = mean ½[log 2π + log V̄ + (y − μ̄)²/V̄],   μ̄ = mean_s μ_s,  V̄ = mean_s (e^{2ℓ_s} + ε)
    L_reg = log(1 + E_id / (E_ood + ε)),            E = mean over batch and outputs of Var_s(μ_s)
    L     = L_nll + λ·L_reg                          (λ = 0.5, ε = 1e-3)

The regulariser pushes the Monte-Carlo spread down on data and up on perturbed inputs. The
published ratio is minimised by zero spread on data whatever the spread off it, and NSAC's
epistemic collapses under it (ψ → 0). ``regulariser="hinge"`` asks instead for a margin
per sequence and its perturbed twin, with r = √(mean over outputs of Var_s(μ_s)) the RMS spread:

    L_reg = mean_b max(0, m − (r_ood,b − r_id,b))     (m = ``margin``, in action units)

which is zero once every twin is at least m more spread than its clean sequence, and never
rewards collapsing the clean spread below that. The hinge is on standard deviations, not
variances: ∂Var/∂θ = 2 Cov_s(μ_s, ∂μ_s/∂θ) vanishes with the spread, so a variance hinge starting
from a near-deterministic head gets no gradient (measured: spreads stayed ~1e-6 with the
variance hinge stuck at its margin), while ∂r/∂θ does not.
``include_epistemic=True`` adds Var_s(μ_s) to V̄ so training uses the same total variance as
inference (the published objective leaves it out; default off for parity).

Perturbation (μ_pert, σ_pert): Gaussian noise added to the tensor the caller perturbs, in THAT
tensor's units. For nsacdrive controllers this is the preprocessed image in [0, 1] (so
σ_pert = 0.2 is a strong perturbation; the published σ = 5 was applied to images in [0, 1] too,
where it is pure noise). BatchNorm running statistics must not learn from perturbed passes:
wrap them in :func:`frozen_batchnorm_statistics`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from nsacdrive.controllers.censored import action_nll
from nsacdrive.controllers.noise import randn_like_on
from nsacdrive.controllers.nsac import LOG_SIGMA_BOUNDS, NSACOutput


def check_targets(prediction: torch.Tensor, target: torch.Tensor, name: str = "target") -> None:
    """Targets must match predictions exactly ([B, out]); never let [B] broadcast to [B, B]."""
    if target.shape != prediction.shape:
        raise ValueError(
            f"{name} has shape {tuple(target.shape)} but predictions have shape {tuple(prediction.shape)}; "
            "targets must be shaped [B, out] (a [B] target would silently broadcast to [B, B])"
        )


def beta_weighted_mean(nll: torch.Tensor, variance: torch.Tensor, beta: float) -> torch.Tensor:
    """Mean of element-wise NLL terms, each weighted by its variance^β held constant (β-NLL, Seitzer et al. 2022).

    β = 0 is the plain mean. With β > 0 an output whose variance collapses (a label that never
    changes, such as a recording's constant throttle or zero brake) no longer takes over the
    shared encoder's gradient: the mean's gradient scales as 1/σ^{2(1−β)} instead of 1/σ².
    """
    if beta == 0:
        return nll.mean()
    return (nll * variance.detach().pow(beta)).mean()


def gaussian_nll(mean: torch.Tensor, log_sigma: torch.Tensor, target: torch.Tensor, beta: float = 0.0) -> torch.Tensor:
    """Mean Gaussian NLL with σ = e^{log σ}, log σ clamped to [−10, 5] (the published convention); β-weighted for β > 0."""
    check_targets(mean, target)
    log_sigma = log_sigma.clamp(*LOG_SIGMA_BOUNDS)
    nll = 0.5 * (math.log(2 * math.pi) + 2 * log_sigma + (target - mean).square() * torch.exp(-2 * log_sigma))
    return beta_weighted_mean(nll, torch.exp(2 * log_sigma), beta)


REGULARISERS = ("ratio", "hinge")


#: added under the square root of the RMS spread, so its gradient stays finite at zero spread
_RMS_EPSILON = 1e-10


def rms_spread(spread: torch.Tensor) -> torch.Tensor:
    """Variances [B, ...] → [B]: each sequence's RMS spread, √(mean over outputs (and time steps) + tiny)."""
    return (spread.reshape(spread.shape[0], -1).mean(1) + _RMS_EPSILON).sqrt()


@dataclass
class NSACLossTerms:
    total: torch.Tensor
    nll: torch.Tensor
    regulariser: torch.Tensor
    epistemic_id: torch.Tensor
    epistemic_ood: torch.Tensor


@dataclass(frozen=True)
class NSACObjective:
    """L = L_nll + λ·L_reg (docs/nsac.md#training-objective); call with clean and perturbed :class:`NSACOutput` draws."""

    lambda_reg: float = 0.5
    epsilon: float = 1e-3
    include_epistemic: bool = False
    beta: float = 0.0  # β-NLL weighting of the likelihood term (:func:`beta_weighted_mean`)
    regulariser: str = "ratio"  # ratio (published) | hinge
    censored_pedals: bool = False  # the pedals' likelihood censored at 0 and 1 (controllers/censored.py)
    margin: float = 0.05  # the hinge's m: the RMS spread (action units) a perturbed twin must exceed its clean sequence's by

    def __post_init__(self) -> None:
        if self.regulariser not in REGULARISERS:
            raise ValueError(f"NSAC regulariser must be one of {', '.join(REGULARISERS)}, got {self.regulariser!r}")
        if self.margin < 0:
            raise ValueError(f"NSAC hinge margin must be >= 0, got {self.margin}")

    def __call__(self, clean: NSACOutput, perturbed: NSACOutput, target: torch.Tensor) -> NSACLossTerms:
        mean_bar = clean.mean.mean(0)
        check_targets(mean_bar, target)
        variance_bar = (torch.exp(2 * clean.log_sigma) + self.epsilon).mean(0)  # NSACHead.predict reports this (+ Var_s μ_s)
        spread_id = clean.mean.var(0, unbiased=False)
        if self.include_epistemic:
            variance_bar = variance_bar + spread_id
        nll = beta_weighted_mean(action_nll(mean_bar, variance_bar, target, self.censored_pedals), variance_bar, self.beta)
        spread_ood = perturbed.mean.var(0, unbiased=False)
        epistemic_id, epistemic_ood = spread_id.mean(), spread_ood.mean()
        if self.regulariser == "hinge":
            twins = spread_ood.shape[0]  # the twins are of the batch's first sequences (all of them, or fewer)
            regulariser = torch.relu(self.margin - (rms_spread(spread_ood) - rms_spread(spread_id[:twins]))).mean()
        else:
            regulariser = torch.log1p(epistemic_id / (epistemic_ood + self.epsilon))
        return NSACLossTerms(nll + self.lambda_reg * regulariser, nll, regulariser, epistemic_id, epistemic_ood)


def gaussian_perturbation(x: torch.Tensor, mean: float, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """x + N(mean, std²) elementwise, in the units of x (μ_pert, σ_pert of the objective)."""
    if std < 0:
        raise ValueError(f"perturbation std must be >= 0, got {std}")
    return x + mean + std * randn_like_on(x.shape, generator, x)


@contextmanager
def frozen_batchnorm_statistics(module: nn.Module) -> Iterator[None]:
    """Run forward passes in training mode without letting BatchNorm running statistics move.

    Momentum is set to 0 for the duration (running ← 1·running + 0·batch keeps the values
    exactly), rather than restoring saved values afterwards: an in-place restore would bump the
    version of tensors an earlier, not yet back-propagated clean pass still refers to.
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (momentum, count) in zip(norms, saved, strict=True):
                m.momentum = momentum
                m.num_batches_tracked.copy_(count)
