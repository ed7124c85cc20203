"""Uncertainty and regression metrics for predictive Gaussians N(m, s²) (docs/driving.md#offline-metrics).

Every comparison in the project scores predictions with these functions, so they implement ONE
documented convention and refuse ambiguous input instead of guessing:

* Inputs are ``[N]`` (one action dimension) or ``[N, D]`` (one column per action dimension) and
  every prediction array must have EXACTLY the shape of ``y``: nothing is broadcast. (A ``[B]``
  target against ``[B, D]`` or ``[B, 1]`` predictions silently broadcasts in numpy - the published
  pipeline's 1-D broadcasting bug. Here it is a ``ValueError`` naming the argument.)
* Reductions average over the sample axis N and return a ``float`` for ``[N]`` input and an
  array ``[D]`` (one value per action dimension) for ``[N, D]`` input.
* s² is the TOTAL predictive variance, aleatoric + epistemic (docs/nsac.md#uncertainty-decomposition).
* Calibration: central-interval coverage at ``levels`` = 100 levels p = linspace(0, 1, 100): the
  observed fraction of |y − m|/s inside the central p-interval of N(0, 1) against p. This is
  uncertainty-toolbox's default (``prop_type="interval"``, ``num_bins=100``), and MACE/RMSCE here
  equal its values. The one-sided quantile form of the paper's ECE (Kuleshov et al. 2018) is
  available as ``kind="quantile"``; name the convention (``ReliabilityDiagram.convention``) in
  every table.
* AUSE: see :func:`ause` (removed-fraction grid k/100, error measure mean |error| by default).

Pure numpy: Φ comes from a vectorised erf series (:func:`_erf`), so scipy is not a runtime
dependency. scipy, properscoring and uncertainty-toolbox serve only as test oracles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Metric = float | np.ndarray  # float for [N] input, [D] array for [N, D] input

_EPS = np.finfo(np.float64).eps
_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
# erfc(6) ≈ 2.2e-17 < eps/2, so erf(x) is ±1 to double precision beyond |x| = 6.
_ERF_SATURATION = 6.0
# The series needs more terms as |x| grows (12 at |x| = 0.5, 30 at 2, 96 at 6), so |x| is
# summed in bands: the common small residuals stop early instead of waiting for the largest.
_ERF_BANDS = np.array([0.5, 1.0, 2.0, 3.0])


# --------------------------------------------------------------------------- validation


def _finite(name: str, x: npt.ArrayLike) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf ({int(np.sum(~np.isfinite(arr)))} entries)")
    return arr


def _data(name: str, x: npt.ArrayLike) -> np.ndarray:
    """A finite float64 array shaped [N] or [N, D] with N >= 1."""
    arr = _finite(name, x)
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise ValueError(f"{name} must be shaped [N] or [N, D] with N, D >= 1, got shape {arr.shape}")
    return arr


def _like(ref_name: str, ref: np.ndarray, name: str, x: npt.ArrayLike) -> np.ndarray:
    """``x`` as a finite float64 array with exactly the shape of ``ref`` (no broadcasting)."""
    arr = _finite(name, x)
    if arr.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {arr.shape} but {ref_name} has shape {ref.shape}; they must match exactly "
            "([N] or [N, D], one column per action dimension) - nothing is broadcast"
        )
    return arr


def _positive(name: str, arr: np.ndarray) -> np.ndarray:
    if np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0 everywhere; {int(np.sum(arr <= 0))} entries are <= 0 (min {arr.min():g})")
    return arr


def _nonnegative(name: str, arr: np.ndarray) -> np.ndarray:
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 everywhere; {int(np.sum(arr < 0))} entries are < 0 (min {arr.min():g})")
    return arr


def _gaussian(y: npt.ArrayLike, mean: npt.ArrayLike, scale: npt.ArrayLike, scale_name: str):
    y = _data("y", y)
    return y, _like("y", y, "mean", mean), _positive(scale_name, _like("y", y, scale_name, scale))


def _per_column(values: np.ndarray) -> Metric:
    """A reduced value as float for [N] input, or the [D] array for [N, D] input."""
    return float(values) if values.ndim == 0 else values


def _reduce(values: np.ndarray, reduce: bool) -> Metric:
    return _per_column(values.mean(axis=0)) if reduce else values


# --------------------------------------------------------------------------- standard normal


def _erf_series(a: np.ndarray) -> np.ndarray:
    """erf(a) for a >= 0 from erf(a) = 2/√π e^{-a²} Σ_n a (2a²)^n / (2n+1)!!.

    Every term is positive, so there is no cancellation; summing until the last term is below
    eps/4 of the total gives ~1e-15 absolute accuracy for 0 <= a <= 6.
    """
    two_a2 = 2.0 * a * a
    term = a.copy()
    total = a.copy()
    n = 0
    while np.any(term > 0.25 * _EPS * total):
        term *= two_a2 / (2 * n + 3)
        total += term
        n += 1
    return (2.0 / _SQRT_PI) * np.exp(-a * a) * total


def _erf(x: np.ndarray) -> np.ndarray:
    """Vectorised error function (absolute error ≲ 3e-15), so Φ needs no scipy."""
    a = np.minimum(np.abs(x), _ERF_SATURATION)
    out = np.empty_like(a)
    band = np.searchsorted(_ERF_BANDS, a, side="right")
    for b in range(len(_ERF_BANDS) + 1):
        inside = band == b
        out[inside] = _erf_series(a[inside])
    return np.sign(x) * np.minimum(out, 1.0)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / _SQRT2))


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / _SQRT_2PI


def _folded_normal_mean(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """E|X| for X ~ N(mu, sigma²): sigma [z(2Φ(z) − 1) + 2φ(z)] with z = mu/sigma."""
    z = mu / sigma
    return sigma * (z * (2.0 * _norm_cdf(z) - 1.0) + 2.0 * _norm_pdf(z))


# --------------------------------------------------------------------------- accuracy and scoring rules


def mse(y: npt.ArrayLike, mean: npt.ArrayLike, *, reduce: bool = True) -> Metric:
    """Mean squared error mean (y − m)² per action dimension (elementwise if ``reduce=False``)."""
    y = _data("y", y)
    return _reduce((y - _like("y", y, "mean", mean)) ** 2, reduce)


def gaussian_nll(y: npt.ArrayLike, mean: npt.ArrayLike, var: npt.ArrayLike, *, reduce: bool = True) -> Metric:
    """Gaussian negative log-likelihood ½log(2πs²) + (y − m)²/(2s²), averaged over samples.

    ``var`` is the total predictive variance s² (> 0). Calibrated data give E[NLL] =
    E[½log(2πs²)] + ½.
    """
    y, mean, var = _gaussian(y, mean, var, "var")
    return _reduce(0.5 * (np.log(2.0 * np.pi * var) + (y - mean) ** 2 / var), reduce)


def gaussian_crps(y: npt.ArrayLike, mean: npt.ArrayLike, std: npt.ArrayLike, *, reduce: bool = True) -> Metric:
    """Closed-form CRPS of N(m, s²) (Gneiting & Raftery 2007): s[z(2Φ(z) − 1) + 2φ(z) − 1/√π].

    z = (y − m)/s. In the units of y; lower is better. Calibrated data give E[CRPS] = E[s]/√π.
    """
    y, mean, std = _gaussian(y, mean, std, "std")
    return _reduce(_folded_normal_mean(y - mean, std) - std / _SQRT_PI, reduce)


def sample_crps(y: npt.ArrayLike, samples: npt.ArrayLike, *, axis: int = -1, reduce: bool = True) -> Metric:
    """CRPS of the empirical distribution of S samples (MC passes or ensemble members).

    CRPS = E|X − y| − ½E|X − X'| with X, X' drawn independently from the S samples (the
    properscoring ``crps_ensemble`` convention, not the "fair" S(S−1) variant). With the samples
    sorted, E|X − X'| = (2/S²) Σ_i (2i − S − 1) x_(i), so a point costs O(S log S), not O(S²).
    ``samples`` has the sample axis at ``axis`` and otherwise the shape of ``y``.
    """
    y = _data("y", y)
    draws = np.moveaxis(_finite("samples", samples), axis, -1)
    if draws.shape[:-1] != y.shape or draws.shape[-1] == 0:
        raise ValueError(
            f"samples must have y's shape {y.shape} plus a non-empty sample axis (axis={axis}), got shape {np.shape(samples)}"
        )
    draws = np.sort(draws, axis=-1)
    s = draws.shape[-1]
    to_target = np.abs(draws - y[..., None]).mean(axis=-1)
    between = (2.0 / s**2) * (draws @ (2.0 * np.arange(1, s + 1) - s - 1))
    return _reduce(to_target - 0.5 * between, reduce)


def gaussian_mixture_crps(
    y: npt.ArrayLike,
    means: npt.ArrayLike,
    stds: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    *,
    reduce: bool = True,
) -> Metric:
    """Closed-form CRPS of a Gaussian mixture Σ_k w_k N(μ_k, σ_k²), e.g. a deep ensemble.

    CRPS = Σ_k w_k A(y − μ_k, σ_k²) − ½ Σ_{k,l} w_k w_l A(μ_k − μ_l, σ_k² + σ_l²) with
    A(μ, σ²) = E|N(μ, σ²)| (Grimit et al. 2006), O(M²) per point. ``means``/``stds`` have y's
    shape plus a trailing component axis M; ``weights`` (default uniform 1/M) is [M] or the same
    shape as ``means``, non-negative and summing to 1 over the components.
    """
    y = _data("y", y)
    mu = _finite("means", means)
    if mu.shape[:-1] != y.shape or mu.shape[-1] == 0:
        raise ValueError(f"means must have y's shape {y.shape} plus a trailing component axis, got shape {mu.shape}")
    sigma = _positive("stds", _like("means", mu, "stds", stds))
    m = mu.shape[-1]
    if weights is None:
        w = np.full(m, 1.0 / m)
    else:
        w = _nonnegative("weights", _finite("weights", weights))
        if w.shape not in ((m,), mu.shape):
            raise ValueError(f"weights must be shaped [M]={(m,)} or like means {mu.shape}, got {w.shape}")
        if not np.allclose(w.sum(axis=-1), 1.0, rtol=0.0, atol=1e-9):
            raise ValueError("weights must sum to 1 over the component axis")
        w = np.broadcast_to(w, mu.shape)
    to_target = np.sum(w * _folded_normal_mean(y[..., None] - mu, sigma), axis=-1)
    pair_w = w[..., :, None] * w[..., None, :]
    pair_sd = np.sqrt(sigma[..., :, None] ** 2 + sigma[..., None, :] ** 2)
    between = np.sum(pair_w * _folded_normal_mean(mu[..., :, None] - mu[..., None, :], pair_sd), axis=(-2, -1))
    return _reduce(to_target - 0.5 * between, reduce)


# --------------------------------------------------------------------------- calibration and sharpness


@dataclass(frozen=True)
class ReliabilityDiagram:
    """Expected against observed coverage: the data behind a reliability diagram.

    ``expected`` [L] are the levels p; ``observed`` is [L] (or [L, D] per action dimension), the
    fraction of samples covered at each level under ``kind``: "interval" = |y − m|/s inside the
    central p-interval of N(0, 1) (the project convention), "quantile" = y below the p-quantile.
    """

    expected: np.ndarray
    observed: np.ndarray
    kind: Literal["interval", "quantile"]

    @property
    def _gap(self) -> np.ndarray:
        return self.observed - self.expected.reshape((-1,) + (1,) * (self.observed.ndim - 1))

    @property
    def mace(self) -> Metric:
        """Mean absolute calibration error over the L levels (0 = calibrated, at most ~0.5)."""
        return _per_column(np.mean(np.abs(self._gap), axis=0))

    @property
    def rmsce(self) -> Metric:
        """Root mean squared calibration error over the L levels."""
        return _per_column(np.sqrt(np.mean(self._gap**2, axis=0)))

    @property
    def convention(self) -> str:
        """The name to print next to MACE/RMSCE in tables (libraries differ)."""
        region = "central intervals" if self.kind == "interval" else "one-sided quantiles"
        return f"{region}, {self.expected.size} levels p=linspace(0,1,{self.expected.size})"


def calibration_curve(
    y: npt.ArrayLike,
    mean: npt.ArrayLike,
    std: npt.ArrayLike,
    levels: int = 100,
    kind: Literal["interval", "quantile"] = "interval",
) -> ReliabilityDiagram:
    """Observed against expected coverage at p = linspace(0, 1, levels) (project convention).

    A sample is covered at level p when its PIT score is <= p: for ``kind="interval"`` the score
    is 2Φ(|z|) − 1 (equivalently |z| <= Φ⁻¹(½ + p/2)), for ``"quantile"`` it is Φ(z), with
    z = (y − m)/s. Both end levels are included, as in uncertainty-toolbox, so p=0 and p=1
    contribute (almost) no error. Cost O(N log N + L log N) per dimension. (uncertainty-toolbox
    0.1.1's ``prop_type="quantile"`` counts (m − y)/s <= Φ⁻¹(p), the mirror image of "quantile"
    here: same MACE/RMSCE on this symmetric grid, mirrored curve.)
    """
    y, mean, std = _gaussian(y, mean, std, "std")
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 2:
        raise ValueError(f"levels must be an integer >= 2, got {levels!r}")
    if kind not in ("interval", "quantile"):
        raise ValueError(f"kind must be 'interval' or 'quantile', got {kind!r}")
    z = (y - mean) / std
    if kind == "interval":
        score = _interval_score(z)
    else:  # Φ(z) > 0 for finite z; its underflow to 0 (z < -8.3) must not count as covered at p = 0
        score = np.maximum(_norm_cdf(z), np.finfo(np.float64).smallest_subnormal)
    return _reliability(score, levels, kind)


def _interval_score(z: np.ndarray) -> np.ndarray:
    """2Φ(|z|) − 1: the smallest central interval level of N(0, 1) that covers z."""
    return _erf(np.abs(z) / _SQRT2)


def pit_calibration_curve(pit: npt.ArrayLike, levels: int = 100, kind: Literal["interval", "quantile"] = "interval") -> ReliabilityDiagram:
    """:func:`calibration_curve` of any predictive distribution from its PIT values u = F(y) ∈ [0, 1].

    The central p-interval [F⁻¹((1−p)/2), F⁻¹((1+p)/2)] covers y iff |2u − 1| <= p; the
    p-quantile is above y iff u <= p. For a Gaussian F this is :func:`calibration_curve` (which
    computes the interval score from |z| directly, for precision in the tails)."""
    u = _finite("pit", pit)
    if u.ndim == 0 or u.shape[0] == 0 or bool(((u < 0) | (u > 1)).any()):
        raise ValueError(f"pit must be a non-empty array of values in [0, 1], got shape {u.shape}")
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 2:
        raise ValueError(f"levels must be an integer >= 2, got {levels!r}")
    if kind not in ("interval", "quantile"):
        raise ValueError(f"kind must be 'interval' or 'quantile', got {kind!r}")
    score = np.abs(2 * u - 1) if kind == "interval" else np.maximum(u, np.finfo(np.float64).smallest_subnormal)
    return _reliability(score, levels, kind)


def _reliability(score: np.ndarray, levels: int, kind: Literal["interval", "quantile"]) -> ReliabilityDiagram:
    """Observed coverage at p = linspace(0, 1, levels): the fraction of scores <= p, per column."""
    expected = np.linspace(0.0, 1.0, levels)
    ranked = np.sort(score.reshape(len(score), -1), axis=0)
    covered = np.stack([np.searchsorted(col, expected, side="right") for col in ranked.T], axis=-1)
    observed = covered.reshape((levels,) + score.shape[1:]) / len(score)
    return ReliabilityDiagram(expected=expected, observed=observed, kind=kind)


def mace(
    y: npt.ArrayLike,
    mean: npt.ArrayLike,
    std: npt.ArrayLike,
    levels: int = 100,
    kind: Literal["interval", "quantile"] = "interval",
) -> Metric:
    """Mean absolute calibration error of :func:`calibration_curve` (100 central-interval levels)."""
    return calibration_curve(y, mean, std, levels, kind).mace


def rmsce(
    y: npt.ArrayLike,
    mean: npt.ArrayLike,
    std: npt.ArrayLike,
    levels: int = 100,
    kind: Literal["interval", "quantile"] = "interval",
) -> Metric:
    """Root mean squared calibration error of :func:`calibration_curve` (100 central-interval levels)."""
    return calibration_curve(y, mean, std, levels, kind).rmsce


def interval_coverage(y: npt.ArrayLike, mean: npt.ArrayLike, half_width: npt.ArrayLike) -> Metric:
    """Fraction of samples with |y − m| <= half_width (per column): the empirical coverage of m ± half_width."""
    y, mean, half_width = _gaussian(y, mean, half_width, "half_width")
    return _per_column(np.mean(np.abs(y - mean) <= half_width, axis=0))


#: z with P(|Z| <= z) = 0.9 for Z ~ N(0, 1): the Gaussian central 90 % interval is m ± z·s.
Z_90 = 1.6448536269514722


def sharpness(std: npt.ArrayLike) -> Metric:
    """Sharpness √(mean s²): the RMS predictive standard deviation (smaller = sharper)."""
    std = _positive("std", _data("std", std))
    return _per_column(np.sqrt(np.mean(std**2, axis=0)))


# --------------------------------------------------------------------------- ranking metrics


def _columns(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1)


def _tie_mean(sorted_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Replace each entry of ``values`` [N, K] by its mean over the run of equal ``sorted_keys``.

    ``sorted_keys`` is sorted along axis 0; runs are taken per column.
    """
    n, k = sorted_keys.shape
    starts = np.ones_like(sorted_keys, dtype=bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = np.cumsum(starts, axis=0) - 1 + n * np.arange(k)  # unique ids across columns
    flat = group.ravel()
    sums = np.bincount(flat, weights=values.ravel(), minlength=n * k)
    counts = np.bincount(flat, minlength=n * k)
    return (sums[flat] / counts[flat]).reshape(n, k)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..N along axis 0 of [N, K], ties sharing their average rank."""
    order = np.argsort(x, axis=0, kind="stable")
    keys = np.take_along_axis(x, order, axis=0)
    positions = np.broadcast_to(np.arange(1.0, len(x) + 1)[:, None], x.shape)
    ranks = np.empty_like(x)
    np.put_along_axis(ranks, order, _tie_mean(keys, positions), axis=0)
    return ranks


@dataclass(frozen=True)
class SparsificationCurves:
    """Sparsification curves of :func:`ause` on the removed-fraction grid ``fractions`` [K].

    ``by_uncertainty`` / ``oracle`` are [K] (or [K, D]): the error measure of the samples kept
    after removing the fraction f with the highest uncertainty / the highest |error|.
    """

    fractions: np.ndarray
    by_uncertainty: np.ndarray
    oracle: np.ndarray
    measure: Literal["mae", "rmse"]

    @property
    def error(self) -> np.ndarray:
        """Sparsification error curve by_uncertainty − oracle (>= 0)."""
        return self.by_uncertainty - self.oracle

    @property
    def area(self) -> Metric:
        """AUSE: the mean of the sparsification error over the grid = its integral over f ∈ [0, 1)."""
        return _per_column(self.error.mean(axis=0))

    @property
    def aurc(self) -> Metric:
        """Area under the risk–coverage curve (Geifman & El-Yaniv 2017): the mean of ``by_uncertainty``,
        i.e. the error of what is kept, averaged over coverages 1 − f. Lower is better; unlike AUSE it
        also counts the error level itself."""
        return _per_column(self.by_uncertainty.mean(axis=0))


def ause(
    error: npt.ArrayLike,
    uncertainty: npt.ArrayLike,
    steps: int = 100,
    measure: Literal["mae", "rmse"] = "mae",
) -> SparsificationCurves:
    """Area under the sparsification error curve (Ilg et al. 2018), with the curves.

    Convention: remove the fraction f_k = k/steps, k = 0..steps−1, of samples with the largest
    ``uncertainty`` (any score, larger = less certain) and measure the rest by mean |error|
    (``measure="mae"``) or RMSE; the oracle removes the largest |error| instead. The kept count is
    N − ⌊f_k N⌋ >= 1. AUSE = mean_k (by_uncertainty − oracle) (a left Riemann sum over f ∈ [0, 1)),
    in the units of the error; 0 when the uncertainty orders the errors perfectly. Tied
    uncertainties are ordered at random in expectation: within a tie the kept errors count at
    their mean (for RMSE the mean square). ``error`` may be signed; it is used as |error|.
    """
    err = _data("error", error)
    unc = _columns(_like("error", err, "uncertainty", uncertainty))
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if measure not in ("mae", "rmse"):
        raise ValueError(f"measure must be 'mae' or 'rmse', got {measure!r}")
    loss = _columns(np.abs(err) if measure == "mae" else err**2)
    n = len(loss)
    kept = n - (np.arange(steps) * n) // steps

    def curve(sorted_loss: np.ndarray) -> np.ndarray:
        per_kept = np.cumsum(sorted_loss, axis=0)[kept - 1] / kept[:, None]
        out = per_kept if measure == "mae" else np.sqrt(per_kept)
        return out.reshape((steps,) + err.shape[1:])

    order = np.argsort(unc, axis=0, kind="stable")  # most certain first: a prefix is what is kept
    by_unc = _tie_mean(np.take_along_axis(unc, order, axis=0), np.take_along_axis(loss, order, axis=0))
    return SparsificationCurves(
        fractions=np.arange(steps) / steps,
        by_uncertainty=curve(by_unc),
        oracle=curve(np.sort(loss, axis=0)),
        measure=measure,
    )


def spearman(uncertainty: npt.ArrayLike, abs_error: npt.ArrayLike) -> Metric:
    """Spearman rank correlation ρ between uncertainty and |error| per action dimension.

    Pearson correlation of average ranks (ties share their mean rank, as scipy.stats.spearmanr).
    NaN when either input is constant in a column. ``abs_error`` must be >= 0: a signed error
    would correlate the wrong quantity.
    """
    unc = _data("uncertainty", uncertainty)
    err = _nonnegative("abs_error", _like("uncertainty", unc, "abs_error", abs_error))
    ra = _average_ranks(_columns(unc))
    rb = _average_ranks(_columns(err))
    ra -= ra.mean(axis=0)
    rb -= rb.mean(axis=0)
    denom = np.sqrt(np.sum(ra**2, axis=0) * np.sum(rb**2, axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(denom > 0, np.sum(ra * rb, axis=0) / denom, np.nan)
    return _per_column(rho[0] if unc.ndim == 1 else rho)


def ood_auroc(uncertainty_in: npt.ArrayLike, uncertainty_out: npt.ArrayLike) -> float:
    """AUROC of uncertainty separating out-of-distribution from in-distribution inputs.

    AUROC = P(u_out > u_in) + ½P(u_out = u_in) over all pairs, from the Mann–Whitney U statistic
    of average ranks in O(n log n). 1 = every OOD input is more uncertain, 0.5 = no separation.
    Both inputs are 1-D (one score per input, e.g. clean and perturbed frames); lengths may differ.
    """
    u_in = _finite("uncertainty_in", uncertainty_in)
    u_out = _finite("uncertainty_out", uncertainty_out)
    for name, arr in (("uncertainty_in", u_in), ("uncertainty_out", u_out)):
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    ranks = _average_ranks(np.concatenate([u_in, u_out])[:, None])[:, 0]
    n_out = u_out.size
    u_stat = ranks[u_in.size :].sum() - n_out * (n_out + 1) / 2.0
    return float(u_stat / (u_in.size * n_out))


def average_precision(score_negative: npt.ArrayLike, score_positive: npt.ArrayLike) -> float:
    """Area under the precision–recall curve as average precision, AP = Σ_k (R_k − R_{k−1})·P_k over
    the distinct score thresholds in descending order (scikit-learn's definition: a tie is one
    threshold, so a constant score gets AP = the positive rate). Inputs as :func:`ood_auroc`'s."""
    negative = _finite("score_negative", score_negative)
    positive = _finite("score_positive", score_positive)
    for name, arr in (("score_negative", negative), ("score_positive", positive)):
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    scores = np.concatenate([negative, positive])
    labels = np.concatenate([np.zeros(negative.size), np.ones(positive.size)])
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    last_of_tie = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])  # the end of each threshold's group
    hits = np.cumsum(labels[order])[last_of_tie]
    precision = hits / (last_of_tie + 1)
    recall_step = np.diff(np.r_[0.0, hits]) / positive.size
    return float(np.sum(recall_step * precision))


# --------------------------------------------------------------------------- episode bootstrap


def group_bootstrap_means(values: npt.ArrayLike, groups: npt.ArrayLike, draws: int = 1000, seed: int = 0) -> np.ndarray:
    """Means of ``values`` [N, ...] over resamples of whole groups (episodes) with replacement: [draws, ...].

    Consecutive sequences of one episode are correlated, so resampling sequences understates the
    spread; resampling episodes does not (the cluster bootstrap). Each draw picks G of the G
    groups uniformly with replacement and weighs every sample by its group's count, so a draw is
    one matrix product of the count matrix [draws, G] with the per-group sums."""
    x = _finite("values", values)
    g = np.asarray(groups)
    if g.shape != x.shape[:1] or x.shape[0] == 0:
        raise ValueError(f"groups must give one label per row of values ({x.shape[0]} rows), got shape {g.shape}")
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise ValueError(f"draws must be an integer >= 1, got {draws!r}")
    labels, index = np.unique(g, return_inverse=True)
    flat = x.reshape(len(x), -1)
    sums = np.zeros((len(labels), flat.shape[1]))
    np.add.at(sums, index, flat)
    sizes = np.bincount(index, minlength=len(labels)).astype(np.float64)
    counts = np.random.default_rng(seed).multinomial(len(labels), np.full(len(labels), 1 / len(labels)), size=draws).astype(np.float64)
    return ((counts @ sums) / (counts @ sizes)[:, None]).reshape((draws,) + x.shape[1:])


def episode_bootstrap_intervals(
    y: npt.ArrayLike, mean: npt.ArrayLike, var: npt.ArrayLike, groups: npt.ArrayLike, *, level: float = 0.95,
    draws: int = 1000, seed: int = 0, levels: int = 100,
) -> dict[str, np.ndarray]:
    """Percentile intervals [2, D] of MSE, Gaussian NLL, CRPS and MACE over episode resamples.

    All four come from one set of resampled group weights: the means of per-sample squared error,
    NLL and CRPS, and for MACE the mean coverage indicators at every calibration level (so the
    resampled MACE is computed exactly as :func:`calibration_curve` computes it)."""
    y, mean, var = _gaussian(y, mean, var, "var")
    y, mean, var = _columns(y), _columns(mean), _columns(var)
    std = np.sqrt(var)
    expected = np.linspace(0.0, 1.0, levels)
    covered = _interval_score((y - mean) / std)[..., None] <= expected  # [N, D, L]
    per_sample = {"mse": (y - mean) ** 2, "nll": gaussian_nll(y, mean, var, reduce=False),
                  "crps": gaussian_crps(y, mean, std, reduce=False)}
    stacked = np.concatenate([np.stack(list(per_sample.values()), axis=-1), covered.astype(np.float64)], axis=-1)  # [N, D, 3 + L]
    resampled = group_bootstrap_means(stacked, groups, draws, seed)  # [draws, D, 3 + L]
    values = {name: resampled[..., k] for k, name in enumerate(per_sample)}
    values["mace"] = np.abs(resampled[..., 3:] - expected).mean(-1)
    tail = 50 * (1 - level)
    return {name: np.percentile(v, [tail, 100 - tail], axis=0) for name, v in values.items()}


# --------------------------------------------------------------------------- censored Gaussians


def _log_norm_cdf(z: np.ndarray) -> np.ndarray:
    """log Φ(z), accurate in the far lower tail (asymptotic series below z = −6, where Φ underflows relative precision)."""
    out = np.empty_like(z)
    tail = z < -_ERF_SATURATION
    out[~tail] = np.log(np.maximum(_norm_cdf(z[~tail]), np.finfo(np.float64).tiny))
    t = z[tail]
    out[tail] = -0.5 * t * t - np.log(-t * _SQRT_2PI) + np.log1p(-1 / (t * t) + 3 / t**4)
    return out


def _integral_cdf(z: np.ndarray) -> np.ndarray:
    """∫_{−∞}^{z} Φ(t) dt = zΦ(z) + φ(z)."""
    return z * _norm_cdf(z) + _norm_pdf(z)


def _integral_cdf_squared(z: np.ndarray) -> np.ndarray:
    """∫_{−∞}^{z} Φ(t)² dt = zΦ(z)² + 2Φ(z)φ(z) − Φ(√2 z)/√π."""
    cdf = _norm_cdf(z)
    return z * cdf * cdf + 2 * cdf * _norm_pdf(z) - _norm_cdf(_SQRT2 * z) / _SQRT_PI


def censored_scores(
    y: npt.ArrayLike, latent_mean: npt.ArrayLike, latent_var: npt.ArrayLike, censored: npt.ArrayLike, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """NLL, CRPS, MACE and 90 % coverage [D] of Y = clip(Y*, 0, 1), Y* ~ N(m, s²), in the columns where ``censored``.

    ``y``, ``latent_mean`` and ``latent_var`` are [N, D]; ``censored`` [D] says which columns are
    clipped to [0, 1] (the others are scored as the plain Gaussian N(m, s²)). The likelihood is
    mixed: the point masses Φ(−m/s) at y = 0 and Φ((m − 1)/s) at y = 1, the density inside, so
    a censored column's NLL is not comparable to a Gaussian's. CRPS is exact: with α, β, ζ the
    standardised 0, 1 and y, CRPS = s[G₂(β) − G₂(α)] − 2s[G₁(β) − G₁(ζ)] + 1 − y, where G₁, G₂
    integrate Φ and Φ². MACE and coverage come from randomised PIT values (uniform on
    [F(y⁻), F(y)] at a point mass, seeded by ``seed``), which are uniform exactly when F is
    calibrated (Czado, Gneiting & Held 2009): coverage_90 is the share with |2u − 1| ≤ 0.9.
    """
    y = _data("y", y)
    if y.ndim != 2:
        raise ValueError(f"y must be [N, D] (one column per action), got shape {y.shape}")
    mean = _like("y", y, "latent_mean", latent_mean)
    var = _positive("latent_var", _like("y", y, "latent_var", latent_var))
    mask = np.asarray(censored, dtype=bool)
    if mask.shape != (y.shape[1],):
        raise ValueError(f"censored must be one flag per column, shape ({y.shape[1]},), got {mask.shape}")
    if np.any(mask & (np.any(y < 0, axis=0) | np.any(y > 1, axis=0))):
        raise ValueError("targets of censored columns must lie in [0, 1]")
    std = np.sqrt(var)
    zeta, alpha, beta = (y - mean) / std, -mean / std, (1 - mean) / std
    at_low, at_high = mask & (y <= 0), mask & (y >= 1)
    nll = np.where(at_low, -_log_norm_cdf(alpha), np.where(at_high, -_log_norm_cdf(-beta), gaussian_nll(y, mean, var, reduce=False)))
    censored_crps = std * (_integral_cdf_squared(beta) - _integral_cdf_squared(alpha)) - 2 * std * (
        _integral_cdf(beta) - _integral_cdf(np.clip(zeta, alpha, beta))) + (1 - y)
    crps = np.where(mask, censored_crps, gaussian_crps(y, mean, std, reduce=False))
    u = np.random.default_rng(seed).random(y.shape)
    cdf_low, cdf_high = _norm_cdf(alpha), _norm_cdf(beta)
    pit = np.where(at_low, u * cdf_low, np.where(at_high, cdf_high + u * (1 - cdf_high), _norm_cdf(zeta)))
    curve = pit_calibration_curve(np.clip(pit, 0.0, 1.0))
    return {"nll": nll.mean(0), "crps": crps.mean(0), "mace": curve.mace, "coverage_90": np.mean(np.abs(2 * pit - 1) <= 0.9, axis=0)}


# --------------------------------------------------------------------------- report


def regression_report(
    y: npt.ArrayLike,
    mean: npt.ArrayLike,
    aleatoric_var: npt.ArrayLike,
    epistemic_var: npt.ArrayLike,
    action_names: list[str] | tuple[str, ...] | None = None,
    levels: int = 100,
    ause_steps: int = 100,
) -> dict[str, object]:
    """All per-action metrics of a predictive Gaussian with s² = aleatoric + epistemic variance.

    Returns ``{"per_action": {name: {metric: value}}, "average": {metric: mean over actions},
    "calibration": convention}`` with metrics mse, nll, crps, mace, rmsce (central intervals,
    ``levels`` levels), sharpness, ause and aurc (mean |error|, ``ause_steps`` fractions), spearman
    (between s and |y − m|) and coverage_90 (of the Gaussian central interval m ± 1.645·s). Names default to ``action_0`` .. ``action_{D-1}``. Either variance may
    be 0 (e.g. a single model has no epistemic part) but their sum must be > 0.
    """
    y = _data("y", y)
    mean = _like("y", y, "mean", mean)
    aleatoric = _nonnegative("aleatoric_var", _like("y", y, "aleatoric_var", aleatoric_var))
    epistemic = _nonnegative("epistemic_var", _like("y", y, "epistemic_var", epistemic_var))
    var = _positive("aleatoric_var + epistemic_var", aleatoric + epistemic)
    y, mean, var = _columns(y), _columns(mean), _columns(var)
    std = np.sqrt(var)
    names = [f"action_{i}" for i in range(y.shape[1])] if action_names is None else list(action_names)
    if len(names) != y.shape[1]:
        raise ValueError(f"action_names has {len(names)} names for {y.shape[1]} action dimensions")
    calibration = calibration_curve(y, mean, std, levels)
    sparsification = ause(y - mean, std, ause_steps)
    columns = {
        "mse": mse(y, mean),
        "nll": gaussian_nll(y, mean, var),
        "crps": gaussian_crps(y, mean, std),
        "mace": calibration.mace,
        "rmsce": calibration.rmsce,
        "sharpness": sharpness(std),
        "ause": sparsification.area,
        "aurc": sparsification.aurc,
        "spearman": spearman(std, np.abs(y - mean)),
        "coverage_90": interval_coverage(y, mean, Z_90 * std),
    }
    return {
        "per_action": {name: {key: float(v[i]) for key, v in columns.items()} for i, name in enumerate(names)},
        "average": {key: float(np.mean(v)) for key, v in columns.items()},
        "calibration": calibration.convention,
    }
