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
from nsacdrive.controllers.density import (
    DENSITY_FILE,
    ConvStatistics,
    DensityError,
    FeatureDensity,
    attach_density,
    fit_density,
    read_density,
    write_density,
)
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.run import load_run
from nsacdrive.envs.observation_kinds import preprocess_for


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


def test_the_same_density_gives_the_same_bytes_every_time(tmp_path):
    """safetensors writes metadata from a hash map in a changing order; the file's header is sorted,
    so a fit's bytes (and the run folder's checksums) repeat, and the file still reads back."""
    density = fit_density(gaussian_features(), (4, 5), "abc")
    blobs = {density.to_bytes() for _ in range(20)}
    assert len(blobs) == 1
    write_density(tmp_path, density)
    assert (tmp_path / DENSITY_FILE).read_bytes() in blobs
    again = read_density(tmp_path)
    assert again.train_seeds == (4, 5) and again.samples == density.samples and again.source == density.source
    assert torch.equal(again.whitening, density.whitening)


def test_a_file_names_an_unknown_source_and_an_old_file_without_one_is_over_tokens(tmp_path):
    from safetensors.torch import save

    density = fit_density(gaussian_features(), (), "")
    tensors = {"mean": density.mean, "whitening": density.whitening.contiguous()}
    metadata = {"method": "gaussian-mahalanobis", "jitter": repr(density.jitter), "train_seeds": "[]", "samples": "2000",
                "data_fingerprint": ""}
    (tmp_path / DENSITY_FILE).write_bytes(save(tensors, metadata))  # as written before sources existed
    assert read_density(tmp_path).source == "tokens"
    (tmp_path / DENSITY_FILE).write_bytes(save(tensors, {**metadata, "source": "pixels"}))
    with pytest.raises(DensityError, match=r"density.safetensors: source 'pixels'"):
        read_density(tmp_path)
    with pytest.raises(ValueError, match=r"tokens, tokens\+conv"):
        fit_density(gaussian_features(), (), "", source="pixels")
    write_density(tmp_path, fit_density(gaussian_features(), (), "", source="tokens+conv"))
    assert read_density(tmp_path).source == "tokens+conv"


# --------------------------------------------------------------------------- convolution statistics

def small_controller(model: str = "gmle", encoder: str = "cnn", **kw):
    torch.manual_seed(0)
    observation = {"observation": "udacity"} if encoder == "nvidia" else {}
    return build_controller(ModelConfig(model=model, d_model=16, num_heads=4, topk=4, **observation,
                                        encoder=EncoderConfig(kind=encoder, token_dim=8, channels=(8, 8, 8)), **kw)).eval()


def controller_frame_shape(controller) -> tuple[int, int, int]:
    encoder = (controller.members[0] if hasattr(controller, "members") else controller).encoder
    return encoder.FRAME_SHAPE


def test_conv_statistics_are_every_convolution_s_channel_means_and_root_mean_squares():
    encoder = small_controller().encoder
    frames = torch.rand(2, 3, 3, 84, 96)
    with ConvStatistics(encoder) as statistics:
        encoder(frames)
    expected, x = [], frames.flatten(0, 1)
    for layer in encoder.features:
        x = layer(x)
        if isinstance(layer, torch.nn.Conv2d):
            expected.append(torch.cat([x.mean((2, 3)), x.double().square().mean((2, 3)).sqrt().float()], 1))
    assert statistics.width == 2 * (8 + 8 + 8) == statistics.values().shape[1]
    torch.testing.assert_close(statistics.values(), torch.cat(expected, 1))
    encoder(frames)  # the hooks are gone once the block ends
    assert statistics.values().shape == (6, statistics.width)
    with pytest.raises(ValueError, match="no convolutions"):
        ConvStatistics(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(("model", "encoder"), [("nsac", "cnn"), ("ensemble", "cnn"), ("nsac", "nvidia")])
def test_tokens_plus_conv_adds_the_newest_frame_s_statistics_to_the_features_and_leaves_the_prediction_alone(model, encoder):
    kw = {"members": 2} if model == "ensemble" else {}
    controller = small_controller(model, encoder, **kw)
    frames, times = torch.rand(3, 4, *controller_frame_shape(controller)), torch.linspace(-0.12, 0.0, 4).expand(3, 4)
    torch.manual_seed(5)
    plain = controller.predict(frames, times, samples=4)
    controller.use_density_source("tokens+conv")
    torch.manual_seed(5)
    with_statistics = controller.predict(frames, times, samples=4)
    for field in ("mean", "aleatoric", "epistemic"):  # the head sees the same tokens
        torch.testing.assert_close(getattr(with_statistics, field), getattr(plain, field))
    members = controller.members if model == "ensemble" else [controller]
    features = controller.density_features(controller.encode(frames))
    expected = []
    for member in members:
        with ConvStatistics(member.encoder) as statistics:
            tokens = member.tokens(frames[:, -1:])
        expected += [tokens.mean(1), statistics.values()]
    torch.testing.assert_close(features, torch.cat(expected, 1))
    with pytest.raises(ValueError, match="density source must be one of tokens, tokens"):
        controller.use_density_source("tokens+conv2d")


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
    assert "density score (tokens) from density.safetensors" in result.output
    (saved,) = json.loads((tmp_path / "table" / "offline.json").read_text())["results"]
    components = saved["ood_auroc_conditions"]["fog-5"]["components"]
    assert set(components) == {"total", "aleatoric", "epistemic", "density"} and 0.0 <= components["density"] <= 1.0
    assert saved["density"] is True and saved["density_source"] == "tokens"
    clean = saved["conditions"]["clean"]
    scale = json.loads((run / "calibration.json").read_text())["variance_scale"]
    raw_nll, cal_nll = clean["per_action"]["steer"]["nll"], clean["per_action_calibrated"]["steer"]["nll"]
    assert raw_nll != cal_nll and np.isfinite(cal_nll) and scale[0] != 1.0
    assert clean["per_action"]["steer"]["mse"] == clean["per_action_calibrated"]["steer"]["mse"]  # the mean is untouched


def test_closed_loop_logs_the_density_of_every_step(run):
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode

    _, log = run_episode(EpisodeKey(str(run), "default", 5, 0), DriveConfig(max_steps=20))
    assert log["density"].shape == (len(log["speed"]),) and bool(np.isfinite(log["density"]).all())


def test_calibrate_fits_a_tokens_plus_conv_density_that_the_closed_loop_reads_from_its_cached_frames(tmp_path):
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode
    from nsacdrive.eval.driver import ControllerPolicy

    # narrow convolutions: the statistics of three tracks' sequences must outnumber the features
    run = tiny_run(tmp_path, seeds=(0, 1, 2, 3, 4), split=("0-2", "3", "4"), encoder=EncoderConfig(token_dim=16, channels=(8, 8, 8)))
    result = CliRunner().invoke(app, ["calibrate", str(run), "--data", str(tmp_path / "data"), "--density-source", "tokens+conv"])
    assert result.exit_code == 0, result.output
    assert "(tokens+conv)" in result.output
    density = read_density(run)
    model, _ = load_run(run)
    assert density.source == "tokens+conv" and density.features == 16 + ConvStatistics(model.encoder).width == 16 + 48
    assert model.density_source == "tokens+conv"
    # the driver caches each frame's encoding (statistics included) and predicts from the history: as a whole sequence does
    policy = ControllerPolicy(run)
    frames = np.random.default_rng(0).integers(0, 256, (7, 96, 96, 3), dtype=np.uint8)
    for frame in frames:
        cached = policy.predict_episodes([0], frame[None], np.array([20.0])).density
    newest = model.density_features(model.encode(torch.from_numpy(preprocess_for("carracing")(frames[-1:]))[:, None],
                                                   torch.tensor([[20.0]])))
    torch.testing.assert_close(cached, density.score(newest), rtol=1e-4, atol=1e-4)
    _, log = run_episode(EpisodeKey(str(run), "default", 5, 0), DriveConfig(max_steps=20))
    assert bool(np.isfinite(log["density"]).all())
    attach_density(model, None)
    assert model.density_source == "tokens" and model.density is None
