"""controllers/metrics.py against analytic oracles, brute force and two reference libraries.

* Analytic: on calibrated data y ~ N(m, s²), E[NLL] = E[½log(2πs²)] + ½, E[CRPS] = E[s]/√π, MACE ≈ 0.
* properscoring 0.1: crps_gaussian and crps_ensemble agree to 1e-10.
* uncertainty-toolbox 0.1.1: nll, crps, sharpness, and MACE/RMSCE/proportions at its default
  ``prop_type="interval", num_bins=100``, which IS the project convention (central intervals,
  p = linspace(0, 1, 100)). Its ``prop_type="quantile"`` counts (m − y)/s <= Φ⁻¹(p), i.e. the
  mirrored (upper-tail) form despite its docstring, so it equals our ``kind="quantile"`` on (−y, −m).
* Brute force: AUROC over all pairs, sparsification curves by explicit removal; scipy's spearmanr.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import properscoring as ps
import pytest
import scipy.special
import scipy.stats
import uncertainty_toolbox as uct
from hypothesis import given
from hypothesis import strategies as st

from nsacdrive.controllers import metrics as M
from nsacdrive.controllers.metrics import (
    ause,
    calibration_curve,
    gaussian_crps,
    gaussian_mixture_crps,
    gaussian_nll,
    mace,
    mse,
    ood_auroc,
    regression_report,
    rmsce,
    sample_crps,
    sharpness,
    spearman,
)

N_LARGE = 200_000


@pytest.fixture(scope="module")
def calibrated() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Heteroscedastic y ~ N(m, s²) with s ∈ [0.2, 2]: every metric's 'perfect' case."""
    rng = np.random.default_rng(0)
    mean = rng.normal(size=N_LARGE)
    std = rng.uniform(0.2, 2.0, N_LARGE)
    return mean + std * rng.standard_normal(N_LARGE), mean, std


@pytest.fixture(scope="module")
def miscalibrated() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Skewed, heavy-tailed residuals with unrelated stds (so no metric sits at a trivial value)."""
    rng = np.random.default_rng(1)
    mean = rng.normal(size=4000)
    std = rng.uniform(0.05, 3.0, 4000)
    y = mean + rng.standard_t(3, 4000) + 0.5 * rng.exponential(size=4000)
    return y, mean, std


# --------------------------------------------------------------------------- standard normal


def test_erf_and_cdf_match_reference_to_machine_precision():
    x = np.concatenate([np.linspace(-12, 12, 48001), [0.0, -0.0, 1e-300, -1e-12, 5.0911, 6.0, -40.0]])
    assert np.max(np.abs(M._erf(x) - scipy.special.erf(x))) < 5e-15
    assert np.max(np.abs(M._norm_cdf(x) - scipy.stats.norm.cdf(x))) < 5e-15


# --------------------------------------------------------------------------- analytic oracles


def test_nll_expectation_on_calibrated_data(calibrated):
    y, mean, std = calibrated
    # NLL_i − ½log(2πs_i²) = z²/2 with mean ½ and standard deviation 1/√2.
    expected = np.mean(0.5 * np.log(2 * np.pi * std**2)) + 0.5
    assert abs(gaussian_nll(y, mean, std**2) - expected) < 4 * np.sqrt(0.5 / N_LARGE)


def test_crps_expectation_on_calibrated_data(calibrated):
    y, mean, std = calibrated
    excess = gaussian_crps(y, mean, std, reduce=False) - std / np.sqrt(np.pi)  # mean 0 when calibrated
    assert abs(excess.mean()) < 4 * excess.std() / np.sqrt(N_LARGE)
    assert abs(gaussian_crps(y, mean, std) - np.mean(std) / np.sqrt(np.pi)) < 4 * excess.std() / np.sqrt(N_LARGE)


def test_mace_near_zero_when_calibrated_and_large_when_not(calibrated):
    y, mean, std = calibrated
    assert mace(y, mean, std) < 0.005 and rmsce(y, mean, std) < 0.005
    assert mace(y, mean, std, kind="quantile") < 0.005
    over = calibration_curve(y, mean, 0.5 * std)  # over-confident: intervals too narrow
    under = calibration_curve(y, mean, 2.0 * std)  # under-confident: intervals too wide
    assert over.mace > 0.15 and under.mace > 0.15 and over.rmsce >= over.mace
    inner = slice(1, -1)
    assert np.all(over.observed[inner] < over.expected[inner])
    assert np.all(under.observed[inner] > under.expected[inner])


def test_calibration_curve_structure(miscalibrated):
    y, mean, std = miscalibrated
    diagram = calibration_curve(y, mean, std)
    np.testing.assert_array_equal(diagram.expected, np.linspace(0, 1, 100))
    assert diagram.observed[0] == 0.0 and diagram.observed[-1] == 1.0
    assert np.all(np.diff(diagram.observed) >= 0)
    assert diagram.convention == "central intervals, 100 levels p=linspace(0,1,100)"
    assert calibration_curve(y, mean, std, levels=15).expected.size == 15
    # Points far in the lower tail (Φ(z) underflows to 0) are not "below the 0-quantile".
    assert calibration_curve([-50.0, 0.0], [0.0, 0.0], [1.0, 1.0], kind="quantile").observed[0] == 0.0
    for bad in (1, 2.5, True):
        with pytest.raises(ValueError, match="levels"):
            calibration_curve(y, mean, std, levels=bad)
    with pytest.raises(ValueError, match="kind"):
        calibration_curve(y, mean, std, kind="one-sided")


def test_sample_crps_of_large_gaussian_sample_approaches_closed_form():
    rng = np.random.default_rng(2)
    mean, std = np.array([0.0, 1.0, -2.0, 0.5]), np.array([1.0, 0.3, 2.0, 0.7])
    y = np.array([0.3, 2.0, -2.5, 0.5])
    draws = 200_000
    samples = mean[:, None] + std[:, None] * rng.standard_normal((4, draws))
    gap = sample_crps(y, samples, reduce=False) - gaussian_crps(y, mean, std, reduce=False)
    assert np.all(np.abs(gap) < 6 * std / np.sqrt(draws))  # 5+ standard errors (≈ 1.1 s/√S at z ≈ 3)


def test_mixture_crps_reduces_to_gaussian_and_matches_large_mixture_sample():
    rng = np.random.default_rng(3)
    y, mean, std = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.1, 2, 50)
    single = gaussian_mixture_crps(y, mean[:, None], std[:, None], reduce=False)
    np.testing.assert_allclose(single, gaussian_crps(y, mean, std, reduce=False), rtol=1e-12, atol=1e-14)
    same = gaussian_mixture_crps(y, np.repeat(mean[:, None], 5, 1), np.repeat(std[:, None], 5, 1), reduce=False)
    np.testing.assert_allclose(same, gaussian_crps(y, mean, std, reduce=False), rtol=1e-12, atol=1e-14)

    means = np.array([[-1.0, 0.5, 2.0], [0.0, 0.1, -0.3]])
    stds = np.array([[0.5, 1.0, 0.3], [0.2, 0.4, 1.5]])
    target = np.array([0.4, -1.0])
    draws = 400_000
    for weights in (None, np.array([0.2, 0.5, 0.3])):
        w = np.full(3, 1 / 3) if weights is None else weights
        comp = rng.choice(3, size=(2, draws), p=w)
        sample = np.take_along_axis(means, comp, 1) + np.take_along_axis(stds, comp, 1) * rng.standard_normal((2, draws))
        np.testing.assert_allclose(
            gaussian_mixture_crps(target, means, stds, weights, reduce=False),
            sample_crps(target, sample, reduce=False),
            atol=4e-3,
        )


def test_mixture_crps_validates_weights_and_shapes():
    y, means, stds = np.zeros(2), np.zeros((2, 3)), np.ones((2, 3))
    with pytest.raises(ValueError, match="sum to 1"):
        gaussian_mixture_crps(y, means, stds, np.array([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="weights must be >= 0"):
        gaussian_mixture_crps(y, means, stds, np.array([1.5, -0.5, 0.0]))
    with pytest.raises(ValueError, match="weights must be shaped"):
        gaussian_mixture_crps(y, means, stds, np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="means must have y's shape"):
        gaussian_mixture_crps(y, np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="stds must be > 0"):
        gaussian_mixture_crps(y, means, np.zeros((2, 3)))


# --------------------------------------------------------------------------- properscoring


def test_gaussian_crps_matches_properscoring():
    rng = np.random.default_rng(4)
    y, mean = rng.normal(scale=3, size=(5000, 3)), rng.normal(size=(5000, 3))
    std = np.exp(rng.uniform(-6, 2, size=(5000, 3)))  # |z| up to ~1e3: the saturated branches too
    ours = gaussian_crps(y, mean, std, reduce=False)
    np.testing.assert_allclose(ours, ps.crps_gaussian(y, mean, std), rtol=1e-10, atol=1e-12)
    assert ours.shape == (5000, 3)


@pytest.mark.parametrize("members", [1, 2, 5, 64])
def test_sample_crps_matches_properscoring_ensemble(members):
    rng = np.random.default_rng(5)
    y = rng.integers(-3, 4, size=(300, 2)).astype(float)
    samples = rng.integers(-3, 4, size=(300, 2, members)).astype(float)  # many ties, y on samples
    samples[:10] += rng.normal(size=(10, 2, members))
    reference = ps.crps_ensemble(y, samples)
    np.testing.assert_allclose(sample_crps(y, samples, reduce=False), reference, rtol=1e-10, atol=1e-12)
    moved = np.moveaxis(samples, -1, 0)  # e.g. [S, B, D] straight from S stochastic passes
    np.testing.assert_allclose(sample_crps(y, moved, axis=0, reduce=False), reference, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- uncertainty-toolbox


def test_scores_match_uncertainty_toolbox(miscalibrated):
    y, mean, std = miscalibrated
    assert gaussian_nll(y, mean, std**2) == pytest.approx(uct.nll_gaussian(mean, std, y), rel=1e-12)
    assert gaussian_crps(y, mean, std) == pytest.approx(uct.crps_gaussian(mean, std, y), rel=1e-12)
    assert sharpness(std) == pytest.approx(uct.sharpness(std), rel=1e-14)


@pytest.mark.parametrize("levels", [100, 15])
def test_calibration_matches_uncertainty_toolbox_interval_convention(miscalibrated, levels):
    y, mean, std = miscalibrated
    diagram = calibration_curve(y, mean, std, levels)
    expected, observed = uct.metrics_calibration.get_proportion_lists_vectorized(mean, std, y, num_bins=levels)
    np.testing.assert_array_equal(diagram.expected, expected)
    np.testing.assert_array_equal(diagram.observed, observed)
    assert diagram.mace == pytest.approx(uct.mean_absolute_calibration_error(mean, std, y, num_bins=levels), abs=1e-15)
    assert diagram.rmsce == pytest.approx(uct.root_mean_squared_calibration_error(mean, std, y, num_bins=levels), abs=1e-15)


def test_quantile_convention_is_the_mirror_of_uncertainty_toolbox(miscalibrated):
    y, mean, std = miscalibrated
    _, theirs = uct.metrics_calibration.get_proportion_lists_vectorized(mean, std, y, prop_type="quantile")
    np.testing.assert_array_equal(calibration_curve(-y, -mean, std, kind="quantile").observed, theirs)
    # Unmirrored, the skewed residuals give a different diagram: theirs(p) = 1 − ours(1 − p) ...
    ours = calibration_curve(y, mean, std, kind="quantile")
    assert np.max(np.abs(ours.observed - theirs)) > 0.1
    np.testing.assert_allclose(ours.observed, 1.0 - theirs[::-1], atol=1e-12)
    # ... but on the symmetric grid linspace(0, 1, L) MACE and RMSCE are the same either way.
    assert ours.mace == pytest.approx(uct.mean_absolute_calibration_error(mean, std, y, prop_type="quantile"), abs=1e-15)
    assert ours.rmsce == pytest.approx(uct.root_mean_squared_calibration_error(mean, std, y, prop_type="quantile"), abs=1e-15)


# --------------------------------------------------------------------------- per-action columns


def test_two_dimensional_inputs_are_scored_column_by_column(miscalibrated):
    y, mean, std = miscalibrated
    rng = np.random.default_rng(6)
    cols = [(y, mean, std), (mean, y, std[::-1]), (y + rng.normal(size=y.size), mean, 0.5 + std)]
    y2, m2, s2 = (np.stack(parts, axis=1) for parts in zip(*cols))
    error = y2 - m2
    batched = {
        "mse": mse(y2, m2),
        "nll": gaussian_nll(y2, m2, s2**2),
        "crps": gaussian_crps(y2, m2, s2),
        "mace": mace(y2, m2, s2),
        "rmsce": rmsce(y2, m2, s2),
        "sharpness": sharpness(s2),
        "ause": ause(error, s2).area,
        "spearman": spearman(s2, np.abs(error)),
        "mixture": gaussian_mixture_crps(y2, np.stack([m2, m2 + 1], -1), np.stack([s2, s2], -1)),
    }
    for d, (yd, md, sd) in enumerate(cols):
        single = {
            "mse": mse(yd, md),
            "nll": gaussian_nll(yd, md, sd**2),
            "crps": gaussian_crps(yd, md, sd),
            "mace": mace(yd, md, sd),
            "rmsce": rmsce(yd, md, sd),
            "sharpness": sharpness(sd),
            "ause": ause(yd - md, sd).area,
            "spearman": spearman(sd, np.abs(yd - md)),
            "mixture": gaussian_mixture_crps(yd, np.stack([md, md + 1], -1), np.stack([sd, sd], -1)),
        }
        for key, value in single.items():
            assert isinstance(value, float)
            assert batched[key].shape == (3,)
            assert batched[key][d] == pytest.approx(value, rel=1e-12, abs=1e-15), key


# --------------------------------------------------------------------------- ranking metrics


def brute_force_auroc(u_in: np.ndarray, u_out: np.ndarray) -> float:
    diff = u_out[:, None] - u_in[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


small_scores = st.lists(st.integers(0, 5) | st.floats(-3, 3, allow_nan=False), min_size=1, max_size=30)


@given(small_scores, small_scores)
def test_auroc_matches_brute_force_with_ties(u_in, u_out):
    u_in, u_out = np.array(u_in, float), np.array(u_out, float)
    assert ood_auroc(u_in, u_out) == pytest.approx(brute_force_auroc(u_in, u_out), abs=1e-12)


def test_auroc_extremes_and_chance():
    rng = np.random.default_rng(7)
    low, high = rng.uniform(0, 1, 500), rng.uniform(1.5, 3, 300)
    assert ood_auroc(low, high) == 1.0
    assert ood_auroc(high, low) == 0.0
    assert ood_auroc(low, low) == 0.5
    n_in, n_out = 20_000, 30_000
    chance = ood_auroc(rng.normal(size=n_in), rng.normal(size=n_out))
    assert abs(chance - 0.5) < 4 * np.sqrt((n_in + n_out + 1) / (12 * n_in * n_out))
    with pytest.raises(ValueError, match="uncertainty_out must be a non-empty 1-D array"):
        ood_auroc(low, high[:, None])
    with pytest.raises(ValueError, match="uncertainty_in must be a non-empty 1-D array"):
        ood_auroc([], high)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=3, max_size=40))
def test_spearman_matches_scipy_with_ties(pairs):
    unc, err = np.array(pairs, float).T
    ours = spearman(unc, err)
    if np.ptp(unc) == 0 or np.ptp(err) == 0:
        assert np.isnan(ours)
    else:
        assert ours == pytest.approx(scipy.stats.spearmanr(unc, err).statistic, abs=1e-12)


def test_spearman_rejects_signed_errors():
    with pytest.raises(ValueError, match="abs_error must be >= 0"):
        spearman(np.ones(3), np.array([0.1, -0.2, 0.3]))


def brute_force_sparsification(error: np.ndarray, uncertainty: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove the top-uncertainty / top-|error| samples one fraction at a time (no ties)."""
    n, by_unc, oracle = error.size, [], []
    for k in range(steps):
        keep = n - int(np.floor(k * n / steps))
        by_unc.append(np.mean(np.abs(error[np.argsort(uncertainty)[:keep]])))
        oracle.append(np.mean(np.sort(np.abs(error))[:keep]))
    return np.array(by_unc), np.array(oracle)


@pytest.mark.parametrize("n, steps", [(1, 10), (7, 10), (100, 100), (257, 20)])
def test_ause_curves_match_brute_force(n, steps):
    rng = np.random.default_rng(n)
    error, uncertainty = rng.normal(size=n), rng.uniform(size=n)
    curves = ause(error, uncertainty, steps)
    by_unc, oracle = brute_force_sparsification(error, uncertainty, steps)
    np.testing.assert_allclose(curves.by_uncertainty, by_unc, rtol=1e-12)
    np.testing.assert_allclose(curves.oracle, oracle, rtol=1e-12)
    np.testing.assert_array_equal(curves.fractions, np.arange(steps) / steps)
    assert curves.area == pytest.approx(np.mean(by_unc - oracle), abs=1e-15)
    assert np.all(curves.error >= -1e-15)


@pytest.mark.parametrize("measure", ["mae", "rmse"])
def test_ause_zero_for_perfect_ranking_positive_otherwise(measure):
    rng = np.random.default_rng(8)
    error = rng.normal(size=2000)
    for perfect in (np.abs(error), error**2 + 1.0, np.log(np.abs(error))):
        assert ause(error, perfect, measure=measure).area == 0.0
    reverse, random = ause(error, -np.abs(error), measure=measure), ause(error, rng.uniform(size=2000), measure=measure)
    assert reverse.area > random.area > 0.0
    everything = np.mean(np.abs(error)) if measure == "mae" else np.sqrt(np.mean(error**2))
    assert reverse.by_uncertainty[0] == pytest.approx(everything) and reverse.oracle[0] == pytest.approx(everything)


def test_ause_counts_tied_uncertainty_at_its_expected_value():
    error = np.array([3.0, -1.0, 2.0, 0.5])
    flat = ause(error, np.zeros(4), steps=4)  # no information: every kept subset is average
    np.testing.assert_allclose(flat.by_uncertainty, np.full(4, 1.625))
    # Kept 3 = {2, 0.5} + one of {3, 1} (2 on average); kept 1 = one of {2, 0.5} (1.25 on average).
    half = ause(error, np.array([1.0, 1.0, 0.0, 0.0]), steps=4)
    np.testing.assert_allclose(half.by_uncertainty, [1.625, (2.5 + 2.0) / 3, 1.25, 1.25])


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    "metric",
    [
        lambda y, m, s: mse(y, m),
        lambda y, m, s: gaussian_nll(y, m, s),
        gaussian_crps,
        calibration_curve,
        mace,
        rmsce,
        lambda y, m, s: regression_report(y, m, s, s),
    ],
)
@pytest.mark.parametrize("columns", [3, 1])
def test_one_d_target_against_per_action_predictions_is_refused(metric, columns):
    # The published pipeline's bug: y [B] against [B, D] (or [B, 1]) predictions broadcasts silently.
    y, mean, scale = np.zeros(8), np.zeros((8, columns)), np.ones((8, columns))
    with pytest.raises(ValueError, match=rf"mean has shape \(8, {columns}\) but y has shape \(8,\)"):
        metric(y, mean, scale)


def test_scale_shape_and_value_errors_name_the_argument():
    y = np.zeros((8, 3))
    with pytest.raises(ValueError, match=r"std has shape \(8,\) but y has shape \(8, 3\)"):
        gaussian_crps(y, y, np.ones(8))
    for bad in (0.0, -1.0):
        scale = np.ones((8, 3))
        scale[2, 1] = bad
        with pytest.raises(ValueError, match="var must be > 0 everywhere; 1 entries"):
            gaussian_nll(y, y, scale)
        with pytest.raises(ValueError, match="std must be > 0"):
            mace(y, y, scale)
        with pytest.raises(ValueError, match="std must be > 0"):
            sharpness(scale)
    for bad in (np.nan, np.inf):
        scale = np.ones((8, 3))
        scale[0, 0] = bad
        with pytest.raises(ValueError, match="var contains NaN or inf"):
            gaussian_nll(y, y, scale)
        with pytest.raises(ValueError, match="y contains NaN or inf"):
            mse(scale, y)
    for shape in [(), (0,), (2, 3, 4), (4, 0)]:
        with pytest.raises(ValueError, match=r"y must be shaped \[N\] or \[N, D\]"):
            mse(np.zeros(shape), np.zeros(shape))
    with pytest.raises(ValueError, match="samples must have y's shape"):
        sample_crps(np.zeros(8), np.zeros((3, 8)))
    with pytest.raises(ValueError, match="uncertainty has shape"):
        ause(np.zeros(8), np.zeros((8, 1)))


# --------------------------------------------------------------------------- report


def risk_coverage_area(abs_error: np.ndarray, uncertainty: np.ndarray, steps: int = 100) -> float:
    """AURC by its definition: the mean |error| of the most certain N − ⌊kN/steps⌋ samples, averaged over k."""
    ranked = abs_error[np.argsort(uncertainty)]
    n = len(ranked)
    return float(np.mean([ranked[: n - (k * n) // steps].mean() for k in range(steps)]))


def test_regression_report_uses_total_variance_per_action(miscalibrated):
    y, mean, std = miscalibrated
    rng = np.random.default_rng(9)
    y2 = np.stack([y, mean + rng.normal(size=y.size)], 1)
    m2 = np.stack([mean, mean], 1)
    aleatoric = np.stack([0.5 * std**2, rng.uniform(0.5, 2, y.size)], 1)
    epistemic = np.stack([0.5 * std**2, np.zeros(y.size)], 1)  # a single model has no epistemic part
    report = regression_report(y2, m2, aleatoric, epistemic, action_names=("steer", "gas"))
    assert set(report) == {"per_action", "average", "calibration"}
    assert list(report["per_action"]) == ["steer", "gas"]
    assert report["calibration"] == "central intervals, 100 levels p=linspace(0,1,100)"
    total = aleatoric + epistemic
    for d, name in enumerate(["steer", "gas"]):
        yd, md, sd = y2[:, d], m2[:, d], np.sqrt(total[:, d])
        direct = {
            "mse": mse(yd, md),
            "nll": gaussian_nll(yd, md, total[:, d]),
            "crps": gaussian_crps(yd, md, sd),
            "mace": mace(yd, md, sd),
            "rmsce": rmsce(yd, md, sd),
            "sharpness": sharpness(sd),
            "ause": ause(yd - md, sd).area,
            "aurc": risk_coverage_area(np.abs(yd - md), sd),
            "spearman": spearman(sd, np.abs(yd - md)),
            "coverage_90": np.mean(np.abs(yd - md) <= 1.6448536269514722 * sd),
        }
        assert report["per_action"][name] == pytest.approx(direct, rel=1e-12)
    for key, value in report["average"].items():
        assert value == pytest.approx(np.mean([report["per_action"][a][key] for a in ("steer", "gas")]), rel=1e-12)
    # Column 0 is calibrated-ish (total var = std²) and matches the toolbox on the same data.
    assert report["per_action"]["steer"]["mace"] == pytest.approx(uct.mean_absolute_calibration_error(mean, std, y), abs=1e-12)


def test_regression_report_single_action_and_errors():
    rng = np.random.default_rng(10)
    y, mean, var = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.5, 1, 50)
    report = regression_report(y, mean, var, np.zeros(50))
    assert list(report["per_action"]) == ["action_0"]
    assert report["average"] == report["per_action"]["action_0"]
    with pytest.raises(ValueError, match="action_names has 2 names for 1 action dimensions"):
        regression_report(y, mean, var, var, action_names=["steer", "gas"])
    with pytest.raises(ValueError, match="epistemic_var must be >= 0"):
        regression_report(y, mean, var, -var)
    with pytest.raises(ValueError, match=r"aleatoric_var \+ epistemic_var must be > 0"):
        regression_report(y, mean, np.zeros(50), np.zeros(50))
    with pytest.raises(ValueError, match=r"aleatoric_var has shape \(50,\) but y has shape \(50, 2\)"):
        regression_report(np.stack([y, y], 1), np.stack([mean, mean], 1), var, np.zeros((50, 2)))


def test_module_does_not_import_test_oracles():
    code = (
        "import sys, nsacdrive.controllers.metrics; "
        "bad = {'scipy', 'properscoring', 'uncertainty_toolbox', 'torch'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


# --------------------------------------------------------------------------- episode bootstrap


def test_group_bootstrap_is_reproducible_and_exact_for_one_group():
    from nsacdrive.controllers.metrics import group_bootstrap_means

    values = np.arange(12.0).reshape(6, 2)
    one_group = group_bootstrap_means(values, np.zeros(6), draws=5)
    np.testing.assert_allclose(one_group, np.broadcast_to(values.mean(0), (5, 2)))
    groups = np.array([0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(group_bootstrap_means(values, groups, 50, seed=3), group_bootstrap_means(values, groups, 50, seed=3))
    draws = group_bootstrap_means(values, groups, 20_000, seed=1)
    assert draws.mean(0) == pytest.approx(values.mean(0), abs=0.05)  # equal group sizes: unbiased
    with pytest.raises(ValueError, match="one label per row"):
        group_bootstrap_means(values, groups[:3])


def test_episode_bootstrap_covers_when_episodes_are_correlated_and_a_sample_bootstrap_does_not():
    from nsacdrive.controllers.metrics import episode_bootstrap_intervals

    rng = np.random.default_rng(0)
    episodes, per_episode, trials = 25, 20, 150
    groups = np.repeat(np.arange(episodes), per_episode)
    true_mse = 0.3**2 + 0.05**2
    hits = {"episode": 0, "sample": 0}
    for _ in range(trials):
        error = rng.normal(0, 0.3, episodes)[groups] + rng.normal(0, 0.05, groups.size)  # errors shared within an episode
        y, mean, var = error[:, None], np.zeros((groups.size, 1)), np.full((groups.size, 1), 0.1)
        for name, labels in (("episode", groups), ("sample", np.arange(groups.size))):
            lo, hi = episode_bootstrap_intervals(y, mean, var, labels, draws=400, seed=1)["mse"][:, 0]
            hits[name] += lo <= true_mse <= hi
    assert hits["episode"] / trials >= 0.85
    assert hits["sample"] / trials <= 0.6


def test_episode_bootstrap_intervals_bracket_the_point_metrics():
    from nsacdrive.controllers.metrics import episode_bootstrap_intervals, gaussian_crps, mace, mse

    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(12), 30)
    y = rng.normal(0, 1, (groups.size, 2))
    mean, std = 0.1 * rng.normal(size=y.shape), rng.uniform(0.5, 1.5, y.shape)
    intervals = episode_bootstrap_intervals(y, mean, std**2, groups)
    for name, point in (("mse", mse(y, mean)), ("crps", gaussian_crps(y, mean, std)), ("mace", mace(y, mean, std))):
        lo, hi = intervals[name]
        assert np.all(lo <= point + 1e-12) and np.all(point <= hi + 1e-12) and np.all(lo < hi)
