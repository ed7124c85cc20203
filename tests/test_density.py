"""Feature density (DDU-style Mahalanobis score): its identities, its file, and its use by a run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from run_fixtures import tiny_run
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.controllers.density import DENSITY_FILE, DensityError, FeatureDensity, fit_density, read_density, write_density
from nsacdrive.controllers.run import load_run


def gaussian_features(n: int = 2000, f: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(f, f, generator=g, dtype=torch.float64) + 2 * torch.eye(f, dtype=torch.float64)
    return torch.randn(n, f, generator=g, dtype=torch.float64) @ mixing + 3.0


def test_the_score_averages_exactly_one_over_the_fitted_features():
    x = gaussian_features()
    density = fit_density(x, (0, 1), "fp")
    assert density.samples == 2000 and density.features == 6
    # E[d²/F] = tr((Σ + jI)⁻¹Σ)/F = 1 − O(j/λ_min) for the population covariance, j = 1e-6 × mean variance
    variances = torch.linalg.eigvalsh(torch.cov(x.T, correction=0))
    assert 0 < 1.0 - float(density.score(x).mean()) < 2 * density.jitter / float(variances.min())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-50, 50), log_scale=st.floats(-3, 3))
def test_the_score_is_unchanged_when_the_features_are_shifted_rotated_and_scaled(seed, shift, log_scale):
    x = gaussian_features(400, 4, seed)
    g = torch.Generator().manual_seed(seed + 1)
    rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    a = np.exp(log_scale) * rotation
    query = torch.cat([x[:25], x[25:50] * 1.5 - 2.0])  # training points and points off the distribution
    plain = fit_density(x, (), "").score(query)
    mapped = fit_density(x @ a + shift, (), "").score(query @ a + shift)
    # an identity (the jitter scales with the mean variance too); float64 rounding of a 4×4 whitening only
    torch.testing.assert_close(mapped, plain, rtol=1e-8, atol=1e-8)


def test_inputs_away_from_the_training_features_score_higher():
    everything = gaussian_features(2500)
    x, near = everything[:2000], everything[2000:]  # fresh draws of the fitted distribution
    density = fit_density(x, (), "")
    far = near + 6 * x.std(0)  # six standard deviations along every feature
    assert 0.8 < float(density.score(near).mean()) < 1.2
    assert float(density.score(far).min()) > float(density.score(near).max())


def test_rank_deficient_features_score_like_full_rank_ones_inside_their_subspace_and_huge_off_it():
    everything = gaussian_features(2500, 3)
    copy = torch.cat([everything, everything[:, :1] * 2.0], 1)  # the 4th feature is a copy: Σ is singular
    density = fit_density(copy[:2000], (), "")
    inside = density.score(copy[2000:])
    off = copy[2000:].clone()
    off[:, 3] += 0.5 * float(copy[:, 3].std())  # half a standard deviation off the subspace
    assert 0.7 < float(inside.mean()) < 1.3 and bool(torch.isfinite(inside).all())
    assert float(density.score(off).min()) > 100 * float(inside.max())


def test_fit_refuses_too_few_samples_and_non_finite_features():
    with pytest.raises(ValueError, match="more than 6 samples"):
        fit_density(gaussian_features(6, 6), (), "")
    bad = gaussian_features(100, 2)
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        fit_density(bad, (), "")
    with pytest.raises(ValueError, match=r"\[B, 6\]"):
        fit_density(gaussian_features(), (), "").score(torch.zeros(2, 5))


def test_the_file_round_trips_and_a_broken_one_is_named(tmp_path):
    density = fit_density(gaussian_features(), (4, 5), "abc")
    write_density(tmp_path, density)
    again = read_density(tmp_path)
    assert isinstance(again, FeatureDensity) and again.train_seeds == (4, 5) and again.data_fingerprint == "abc"
    torch.testing.assert_close(again.mean, density.mean, rtol=0, atol=0)  # the stored values, bit for bit
    torch.testing.assert_close(again.whitening, density.whitening, rtol=0, atol=0)
    # the scores through another memory layout (the file's tensors are contiguous): float64 rounding apart
    torch.testing.assert_close(again.score(gaussian_features(10)), density.score(gaussian_features(10)), rtol=1e-12, atol=0)
    assert read_density(tmp_path / "nowhere") is None
    (tmp_path / DENSITY_FILE).write_bytes(b"not a file")
    with pytest.raises(DensityError, match=DENSITY_FILE):
        read_density(tmp_path)


# --------------------------------------------------------------------------- with a run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("density"), seeds=(0, 1, 2, 3), split=("0-1", "2", "3"), batches=2)
    result = CliRunner().invoke(app, ["calibrate", str(run), "--data", str(run.parent / "data"), "--density-samples", "40"])
    assert result.exit_code == 0, result.output
    assert DENSITY_FILE in result.output
    return run


def test_calibrate_fits_the_density_on_the_training_tracks_and_load_run_attaches_it(run):
    density = read_density(run)
    assert density.train_seeds == (0, 1) and density.samples == 40
    model, _ = load_run(run, raw=True)  # the density is not a recalibration: raw runs keep it
    frames, times = torch.rand(3, 4, 3, 84, 96), torch.linspace(-0.12, 0.0, 4).expand(3, 4)
    prediction = model.predict(frames, times, samples=4)
    expected = density.score(model.density_features(model.encode(frames)))
    torch.testing.assert_close(prediction.density, expected)
    # one by one = batched, to float32 rounding of the encoder (the score itself is float64)
    rows = torch.cat([model.predict(frames[i:i + 1], times[i:i + 1], samples=4).density for i in range(3)])
    torch.testing.assert_close(rows, prediction.density, rtol=1e-4, atol=1e-4)


def test_evaluate_offline_reports_the_density_auroc_and_both_raw_and_calibrated_metrics(run, tmp_path):
    result = CliRunner().invoke(app, ["evaluate-offline", str(run), "--data", str(run.parent / "data"), "--corruptions",
                                      "fog-5", "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    assert "density score from density.safetensors" in result.output
    (saved,) = json.loads((tmp_path / "table" / "offline.json").read_text())["results"]
    components = saved["ood_auroc_conditions"]["fog-5"]["components"]
    assert set(components) == {"total", "aleatoric", "epistemic", "density"} and 0.0 <= components["density"] <= 1.0
    clean = saved["conditions"]["clean"]
    scale = json.loads((run / "calibration.json").read_text())["variance_scale"]
    raw_nll, cal_nll = clean["per_action"]["steer"]["nll"], clean["per_action_calibrated"]["steer"]["nll"]
    assert raw_nll != cal_nll and np.isfinite(cal_nll) and scale[0] != 1.0
    assert clean["per_action"]["steer"]["mse"] == clean["per_action_calibrated"]["steer"]["mse"]  # the mean is untouched


def test_closed_loop_logs_the_density_of_every_step(run):
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode

    _, log = run_episode(EpisodeKey(str(run), "default", 5, 0), DriveConfig(max_steps=20))
    assert log["density"].shape == (len(log["speed"]),) and bool(np.isfinite(log["density"]).all())
