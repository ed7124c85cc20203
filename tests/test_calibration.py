"""Recalibration (``nsacdrive calibrate``): the variance factor, conformal widths, the file, and its use."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from run_fixtures import tiny_run
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.controllers.calibration import (
    CALIBRATION_FILE,
    CalibrationError,
    data_fingerprint,
    fit_calibration,
    read_calibration,
)
from nsacdrive.controllers.metrics import gaussian_nll
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.controllers.run import load_run
from nsacdrive.data_collection.dataset import SequenceDataset
from nsacdrive.eval.offline import evaluate_run


def overconfident(n: int = 4000, seed: int = 0, factor: tuple[float, ...] = (3.0, 0.5, 1.0)):
    """Targets whose true std is ``factor`` × the predicted std, per action."""
    rng = np.random.default_rng(seed)
    mean = rng.uniform(-0.5, 0.5, (n, 3))
    std = rng.uniform(0.05, 0.2, (n, 3))
    target = mean + np.asarray(factor) * std * rng.standard_normal((n, 3))
    return target, mean, std ** 2


def test_the_variance_factor_recovers_a_known_miscalibration_and_maximises_the_likelihood():
    target, mean, variance = overconfident()
    calibration = fit_calibration(target, mean, variance, (5,), "x")
    # E[(y − μ)²/σ²] = factor²; 4000 samples: relative s.e. √(2/4000) ≈ 2.2 %, so 10 % is > 4 s.e.
    np.testing.assert_allclose(calibration.variance_scale, (9.0, 0.25, 1.0), rtol=0.1)
    scale = np.asarray(calibration.variance_scale)
    best = np.asarray(gaussian_nll(target, mean, variance * scale))
    for nudge in (0.9, 1.1):  # the closed form is the NLL's minimum in s² (per action)
        assert np.all(best < np.asarray(gaussian_nll(target, mean, variance * scale * nudge)))


def test_conformal_widths_cover_their_level_on_fresh_data_from_the_same_distribution():
    calibration = fit_calibration(*overconfident(seed=1), (5,), "x")
    target, mean, variance = overconfident(seed=2)
    sigma = np.sqrt(variance * np.asarray(calibration.variance_scale))
    for level, widths in calibration.conformal.items():
        covered = (np.abs(target - mean) <= np.asarray(widths) * sigma).mean(0)
        # 1 − α ± 4 binomial s.e. over 4000 fresh samples
        assert np.all(np.abs(covered - (1 - float(level))) < 4 * np.sqrt(0.1 * 0.9 / 4000)), (level, covered)


def test_fit_refuses_bad_shapes_non_positive_variances_and_too_few_samples():
    target, mean, variance = overconfident(n=40)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        fit_calibration(target[:, :2], mean[:, :2], variance[:, :2], (0,), "x")
    with pytest.raises(ValueError, match="> 0"):
        fit_calibration(target, mean, np.zeros_like(variance), (0,), "x")
    with pytest.raises(ValueError, match="at least 19"):
        fit_calibration(target[:10], mean[:10], variance[:10], (0,), "x")


def test_apply_scales_both_variance_parts_and_keeps_the_mean():
    calibration = fit_calibration(*overconfident(), (5,), "x")
    prediction = UncertainPrediction(torch.zeros(2, 3), torch.full((2, 3), 0.01), torch.full((2, 3), 0.002))
    out = calibration.apply(prediction)
    scale = torch.tensor(calibration.variance_scale, dtype=torch.float32)
    assert torch.equal(out.mean, prediction.mean)
    torch.testing.assert_close(out.aleatoric, 0.01 * scale.expand(2, 3))
    torch.testing.assert_close(out.epistemic, 0.002 * scale.expand(2, 3))


def heavy_tailed(n: int = 4000, seed: int = 0):
    """Predicted Gaussians whose residuals are Student-t (ν = 3): no variance factor makes them calibrated."""
    rng = np.random.default_rng(seed)
    mean = rng.uniform(-0.5, 0.5, (n, 3))
    std = rng.uniform(0.05, 0.2, (n, 3))
    return mean + std * rng.standard_t(3, (n, 3)), mean, std ** 2


def test_isotonic_recalibration_repairs_what_variance_scaling_cannot_on_fresh_data():
    from nsacdrive.controllers.metrics import mace, pit_calibration_curve

    calibration = fit_calibration(*heavy_tailed(seed=1), (5,), "x", isotonic=True)
    assert calibration.method == "variance-scaling+isotonic"
    target, mean, variance = heavy_tailed(seed=2)
    scaled = np.asarray(mace(target, mean, np.sqrt(variance * np.asarray(calibration.variance_scale))))
    recalibrated = np.asarray(pit_calibration_curve(calibration.recalibrated_pit(target, mean, variance)).mace)
    # t(3) scaled to unit variance is too peaked and too heavy for any Gaussian: MACE ≈ 0.04 after scaling;
    # the recalibrated CDF is uniform up to sampling noise (≈ 0.01 for 4000 fresh samples)
    assert np.all(scaled > 0.03) and np.all(recalibrated < 0.015), (scaled, recalibrated)


def test_pit_curve_of_a_gaussian_is_the_gaussian_curve():
    from nsacdrive.controllers.calibration import gaussian_pit
    from nsacdrive.controllers.metrics import calibration_curve, pit_calibration_curve

    target, mean, variance = overconfident()
    pit = gaussian_pit(target, mean, variance)
    for kind in ("interval", "quantile"):
        np.testing.assert_array_equal(pit_calibration_curve(pit, kind=kind).observed,
                                      calibration_curve(target, mean, np.sqrt(variance), kind=kind).observed)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pit_calibration_curve(pit + 1.0)


def test_an_isotonic_calibration_round_trips_and_a_broken_one_is_named():
    from nsacdrive.controllers.calibration import Calibration

    calibration = fit_calibration(*heavy_tailed(n=200), (5,), "x", isotonic=True)
    saved = json.loads(json.dumps(calibration.to_dict()))  # as written to and read from calibration.json
    assert saved["method"] == "variance-scaling+isotonic" and Calibration.from_dict(saved) == calibration
    assert "isotonic" not in fit_calibration(*heavy_tailed(n=200), (5,), "x").to_dict()
    broken = {**saved, "isotonic": [list(reversed(q)) for q in saved["isotonic"]]}
    with pytest.raises(CalibrationError, match="non-decreasing PIT quantiles"):
        Calibration.from_dict(broken, "RUN/calibration.json")


def test_the_fingerprint_ignores_order_and_sees_any_change():
    assert data_fingerprint(["a", "b"]) == data_fingerprint(["b", "a"]) != data_fingerprint(["a", "c"])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("calibrate"), seeds=(0, 1, 2, 3), split=("0-1", "2", "3"), batches=2)


def test_calibrate_writes_the_fit_and_every_loader_applies_it_unless_raw(run):
    data = run.parent / "data"
    result = CliRunner().invoke(app, ["calibrate", str(run), "--data", str(data)])
    assert result.exit_code == 0, result.output
    assert "calibration.json" in result.output and "s²" in result.output
    saved = json.loads((run / CALIBRATION_FILE).read_text())
    assert saved["method"] == "variance-scaling" and saved["val_seeds"] == [2]
    episodes = SequenceDataset(data, [2], colour_presets=["default"]).episodes
    assert saved["data_fingerprint"] == data_fingerprint([e.sidecar["sha256"] for e in episodes])

    raw_model, _ = load_run(run, raw=True)
    model, _ = load_run(run)
    assert raw_model.calibration is None and model.calibration == read_calibration(run)
    frames, times = torch.rand(2, 4, 3, 84, 96), torch.linspace(-0.12, 0.0, 4).expand(2, 4)
    torch.manual_seed(0)
    raw = raw_model.predict(frames, times, samples=4)
    torch.manual_seed(0)
    recalibrated = model.predict(frames, times, samples=4)
    scale = torch.tensor(saved["variance_scale"], dtype=torch.float32)
    torch.testing.assert_close(recalibrated.aleatoric, raw.aleatoric * scale)
    assert evaluate_run(run, data, "val")["recalibration"] == "variance-scaling"
    assert evaluate_run(run, data, "val", raw=True)["recalibration"] == "none"
    offline = CliRunner().invoke(app, ["evaluate-offline", str(run), "--data", str(data), "--split", "val",
                                       "--out", str(run.parent / "offline")])
    assert "recalibrated by calibration.json" in offline.output and "variance-scaling" in (run.parent / "offline" / "offline.md").read_text()


def test_a_broken_calibration_file_is_named_with_its_field(run, tmp_path):
    import shutil

    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    saved = json.loads((run / CALIBRATION_FILE).read_text()) if (run / CALIBRATION_FILE).exists() else None
    (broken / CALIBRATION_FILE).write_text(json.dumps({**(saved or {"method": "variance-scaling", "actions": ["steer", "gas", "brake"]}),
                                                       "variance_scale": [1.0, -2.0, 1.0]}))
    with pytest.raises(CalibrationError, match="variance_scale must be 3 positive numbers"):
        load_run(broken)
    assert load_run(broken, raw=True)[0].calibration is None


def test_closed_loop_logs_recalibrated_variances_unless_raw(run):
    """Same episode twice: the steps and actions are identical (the mean is untouched), the logged
    variances differ by exactly the fitted factors."""
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode

    if not (run / CALIBRATION_FILE).exists():
        CliRunner().invoke(app, ["calibrate", str(run), "--data", str(run.parent / "data")])
    key = EpisodeKey(str(run), "default", 5, 0)
    _, calibrated_log = run_episode(key, DriveConfig(max_steps=30))
    _, raw_log = run_episode(key, DriveConfig(max_steps=30, raw=True))
    np.testing.assert_array_equal(calibrated_log["executed_action"], raw_log["executed_action"])
    scale = np.asarray(read_calibration(run).variance_scale, dtype=np.float32)
    np.testing.assert_allclose(calibrated_log["aleatoric"], raw_log["aleatoric"] * scale, rtol=1e-6)


# --------------------------------------------------------------------------- Lévy's deviation σ̂


@pytest.fixture(scope="module")
def levy_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("levy"), model="levy", seeds=(0, 1, 2, 3), split=("0-1", "2", "3"), batches=2)


def test_levy_predictions_carry_the_layer_signals(levy_run):
    model, _ = load_run(levy_run, raw=True)
    frames, times = torch.rand(3, 4, 3, 84, 96), torch.linspace(-0.12, 0.0, 4).expand(3, 4)
    prediction = model.predict(frames, times, samples=4)
    tokens = model.encode(frames)
    expected = model.head.signals(tokens, model.token_times(times))
    assert set(prediction.signals) == {"evidence", "disagreement", "deviation"}
    for name, value in expected.items():
        torch.testing.assert_close(prediction.signals[name], value)
    joined = UncertainPrediction.cat([model.predict(frames[i:i + 1], times[i:i + 1], samples=4) for i in range(3)])
    torch.testing.assert_close(joined.signals["deviation"], prediction.signals["deviation"], rtol=1e-4, atol=1e-6)


def test_calibrate_fits_the_deviation_scale_of_a_levy_run_and_evaluation_scores_it(levy_run, tmp_path):
    data = levy_run.parent / "data"
    result = CliRunner().invoke(app, ["calibrate", str(levy_run), "--data", str(data)])
    assert result.exit_code == 0, result.output
    assert "a·σ̂ + b" in result.output
    calibration = read_calibration(levy_run)
    a, b = calibration.deviation_scale
    assert len(a) == len(b) == 3 and all(v >= 0 for v in (*a, *b))
    np.testing.assert_allclose(calibration.deviation_std(np.ones((2, 3))), np.broadcast_to(np.asarray(a) + np.asarray(b), (2, 3)))
    saved = evaluate_run(levy_run, data, "val", corruptions=[])
    clean = saved["conditions"]["clean"]
    assert set(clean["per_action_deviation"]) == {"steer", "gas", "brake"}
    assert clean["per_action_deviation"]["steer"]["mse"] == clean["per_action"]["steer"]["mse"]  # same mean, another scale
    raw = json.loads((levy_run / CALIBRATION_FILE).read_text())
    with pytest.raises(CalibrationError, match="deviation_scale must be"):
        from nsacdrive.controllers.calibration import Calibration

        Calibration.from_dict({**raw, "deviation_scale": [[1.0, 1.0], [0.0, 0.0, 0.0]]})
