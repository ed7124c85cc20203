"""Per-action calibration of the Lévy deviation σ̂ and split-conformal intervals (docs/levy.md#calibration).

σ̂ is an exact RMS deviation of the sampled layer, not of the prediction error, so it is mapped
to an action-unit scale s = a·σ̂ + b (a, b ≥ 0) fitted once on validation data by a coarse grid
search minimising the mean closed-form Gaussian CRPS of N(μ, s²). Never fit on test data.
Intervals: Gaussian μ ± z_{1−α/2}·s, or split conformal μ ± q̂·s with q̂ the
⌈(n+1)(1−α)⌉-th smallest calibration score |y − μ|/s. Conformal coverage needs exchangeable
data, which closed-loop driving breaks: read the intervals as a monitored scale, not a guarantee.

Everything runs in float64 torch; inputs may be tensors or array-likes. Arrays are [N] (one
action) or [N, A] (A actions, each calibrated separately); results have the trailing shape.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_A_GRID_DECADES = (-2.0, 1.0)  # default a grid: a_ref·10^[-2, 1], a_ref = std(y)/mean(σ̂)
_A_GRID_POINTS = 61  # 20 points per decade: a step of 12%
_B_GRID_POINTS = 21
_A_ROWS_PER_PASS = 8


def _as_float64(name: str, x: object) -> Tensor:
    t = torch.as_tensor(x, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite")
    return t


def _gaussian_crps(mu: Tensor, scale: Tensor, y: Tensor) -> Tensor:
    """Closed-form CRPS of N(μ, s²) at y (Gneiting & Raftery): s[z(2Φ(z) − 1) + 2ϕ(z) − 1/√π]."""
    z = (y - mu) / scale
    pdf = torch.exp(-0.5 * z.square()) / math.sqrt(2 * math.pi)
    return scale * (z * (2 * torch.special.ndtr(z) - 1) + 2 * pdf - 1 / math.sqrt(math.pi))


def _check_grid(name: str, grid: object) -> Tensor:
    g = _as_float64(name, grid)
    if g.dim() != 1 or g.numel() == 0 or bool((g < 0).any()):
        raise ValueError(f"{name} must be a non-empty 1-D grid of values >= 0")
    return g


def fit_affine_scale(
    mu: object, sigma_hat: object, y: object, a_grid: object | None = None, b_grid: object | None = None
) -> tuple[Tensor, Tensor]:
    """Grid-search (a, b) ≥ 0 per action minimising mean CRPS of N(μ, (a·σ̂ + b)²) at y.

    ``mu``, ``sigma_hat`` (≥ 0) and ``y`` share a shape [N] or [N, A]. Default grids, per
    action: a ∈ {0} ∪ a_ref·10^[−2, 1] (61 log-spaced points, a_ref = std(y)/mean(σ̂)) and
    b ∈ linspace(0, std(y), 21). Given grids are 1-D and shared by all actions. Candidates
    that give s = 0 for any sample are skipped. Cost: one CRPS evaluation per sample, action
    and grid point (1302 per sample with the default grids). Returns (a, b) with shape [] or [A]. a = 0 means
    σ̂ carries no information for that action (docs/levy.md#calibration).
    """
    mu_t, sigma_t, y_t = _as_float64("mu", mu), _as_float64("sigma_hat", sigma_hat), _as_float64("y", y)
    if not (mu_t.shape == sigma_t.shape == y_t.shape) or mu_t.dim() not in (1, 2) or mu_t.shape[0] < 2:
        raise ValueError(
            f"mu, sigma_hat and y must share a shape [N] or [N, A] with N >= 2, got {tuple(mu_t.shape)}, {tuple(sigma_t.shape)}, {tuple(y_t.shape)}"
        )
    if bool((sigma_t < 0).any()):
        raise ValueError("sigma_hat must be >= 0")
    one_action = mu_t.dim() == 1
    if one_action:
        mu_t, sigma_t, y_t = mu_t[:, None], sigma_t[:, None], y_t[:, None]
    spread = y_t.std(dim=0)  # [A]
    if a_grid is None:
        reference = spread / sigma_t.mean(dim=0).clamp(min=torch.finfo(torch.float64).tiny)
        steps = torch.logspace(*_A_GRID_DECADES, _A_GRID_POINTS, dtype=torch.float64)
        a_values = torch.cat([torch.zeros(1, reference.numel(), dtype=torch.float64), steps[:, None] * reference])
    else:
        a_values = _check_grid("a_grid", a_grid)[:, None].expand(-1, mu_t.shape[1])
    if b_grid is None:
        b_values = torch.linspace(0, 1, _B_GRID_POINTS, dtype=torch.float64)[:, None] * spread
    else:
        b_values = _check_grid("b_grid", b_grid)[:, None].expand(-1, mu_t.shape[1])

    best = torch.full((mu_t.shape[1],), math.inf, dtype=torch.float64)
    best_a, best_b = torch.zeros_like(best), torch.zeros_like(best)
    tiny = torch.finfo(torch.float64).tiny
    for a in a_values.split(_A_ROWS_PER_PASS):  # [Ga, Gb, N, A] per pass stays a few MB
        scale = a[:, None, None, :] * sigma_t + b_values[None, :, None, :]
        score = _gaussian_crps(mu_t, scale.clamp(min=tiny), y_t).mean(dim=2)  # [Ga, Gb, A]
        score = score.masked_fill(~(scale > 0).all(dim=2), math.inf).flatten(0, 1)
        pass_best, index = score.min(dim=0)
        better = pass_best < best
        best = torch.where(better, pass_best, best)
        best_a = torch.where(better, a.gather(0, (index // b_values.shape[0])[None])[0], best_a)
        best_b = torch.where(better, b_values.gather(0, (index % b_values.shape[0])[None])[0], best_b)
    if not bool(torch.isfinite(best).all()):
        raise ValueError("no (a, b) on the grids gives a positive scale for every sample")
    return (best_a[0], best_b[0]) if one_action else (best_a, best_b)


def gaussian_interval(mu: object, scale: object, alpha: float) -> tuple[Tensor, Tensor]:
    """Central Gaussian interval μ ± z_{1−α/2}·s at miscoverage α ∈ (0, 1)."""
    _check_alpha(alpha)
    width = torch.special.ndtri(torch.tensor(1 - alpha / 2, dtype=torch.float64)) * _as_float64("scale", scale)
    mu_t = _as_float64("mu", mu)
    return mu_t - width, mu_t + width


def conformal_scores(y: object, mu: object, scale: object) -> Tensor:
    """Normalised absolute residuals |y − μ|/s on the calibration split (s > 0)."""
    y_t, mu_t, scale_t = _as_float64("y", y), _as_float64("mu", mu), _as_float64("scale", scale)
    if not (y_t.shape == mu_t.shape == scale_t.shape):
        raise ValueError(
            f"y, mu and scale must share a shape, got {tuple(y_t.shape)}, {tuple(mu_t.shape)}, {tuple(scale_t.shape)}"
        )
    if bool((scale_t <= 0).any()):
        raise ValueError("scale must be > 0")
    return (y_t - mu_t).abs() / scale_t


def conformal_quantile(scores: object, alpha: float) -> Tensor:
    """q̂ = the ⌈(n+1)(1−α)⌉-th smallest of n scores (along dim 0), +∞ when that exceeds n.

    With exchangeable data, μ ± q̂·s then covers a new y with probability ≥ 1 − α (and
    < 1 − α + 1/(n+1) without ties). The rank is computed with a 1e-9 guard so that products like
    100 × 0.9 that land a rounding error above an integer are not pushed up by one.
    """
    _check_alpha(alpha)
    s = _as_float64("scores", scores)
    if s.dim() not in (1, 2) or s.shape[0] == 0:
        raise ValueError(f"scores must have shape [n] or [n, A] with n >= 1, got {tuple(s.shape)}")
    n = s.shape[0]
    rank = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    if rank > n:
        return torch.full(s.shape[1:], math.inf, dtype=torch.float64)
    return s.sort(dim=0).values[max(rank, 1) - 1]


def conformal_interval(mu: object, scale: object, q_hat: object) -> tuple[Tensor, Tensor]:
    """Split-conformal interval μ ± q̂·s."""
    mu_t, width = _as_float64("mu", mu), torch.as_tensor(q_hat, dtype=torch.float64) * _as_float64("scale", scale)
    return mu_t - width, mu_t + width


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
