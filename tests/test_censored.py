"""The censored-Gaussian pedal likelihood: moments, likelihood, heads and scores."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from nsacdrive.controllers.censored import (
    LATENT_HIGH,
    LATENT_LOW,
    censored_nll,
    clipped_moments,
    observed_moments,
    squash_latent,
)
from nsacdrive.controllers.metrics import censored_scores, gaussian_crps, sample_crps
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller

float64 = dict(dtype=torch.float64)


# ---------------------------------------------------------------------------------- moments


@settings(max_examples=30, deadline=None)
@given(mean=st.floats(-1.0, 2.0), std=st.floats(0.01, 1.0))
def test_clipped_moments_match_numerical_integration(mean, std):
    m, v = clipped_moments(torch.tensor(mean, **float64), torch.tensor(std**2, **float64))
    law = stats.norm(mean, std)
    inside_first = integrate.quad(lambda y: y * law.pdf(y), 0, 1, points=[min(max(mean, 0), 1)])[0]
    inside_second = integrate.quad(lambda y: y * y * law.pdf(y), 0, 1, points=[min(max(mean, 0), 1)])[0]
    first, second = inside_first + law.sf(1.0), inside_second + law.sf(1.0)
    assert float(m) == pytest.approx(first, abs=1e-9)
    assert float(v) == pytest.approx(second - first**2, abs=1e-9)


def test_clipped_moments_limits():
    # well inside the box with a small σ: the Gaussian's own moments; far below: a point mass at 0
    m, v = clipped_moments(torch.tensor([0.5, -3.0, 4.0], **float64), torch.tensor([1e-4, 0.01, 0.01], **float64))
    torch.testing.assert_close(m, torch.tensor([0.5, 0.0, 1.0], **float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(v, torch.tensor([1e-4, 0.0, 0.0], **float64), atol=1e-12, rtol=1e-9)


def test_observed_moments_are_the_mixture_of_clipped_draws():
    generator = torch.Generator().manual_seed(0)
    means = torch.tensor([[[0.1, -0.2, 0.9]], [[-0.3, 0.3, 1.2]], [[0.2, 0.05, 0.6]]], **float64)  # S = 3, B = 1
    variances = torch.tensor([[[0.04, 0.09, 0.01]], [[0.01, 0.04, 0.09]], [[0.02, 0.01, 0.04]]], **float64)
    mean, aleatoric, epistemic = observed_moments(means, variances)
    draws = means + variances.sqrt() * torch.randn((200_000,) + means.shape, generator=generator, **float64)
    draws[..., 1:] = draws[..., 1:].clamp(0, 1)  # steer is not censored
    mixture = draws.flatten(0, 1)
    torch.testing.assert_close(mean, mixture.mean(0), atol=3e-3, rtol=0)
    torch.testing.assert_close(aleatoric + epistemic, mixture.var(0), atol=3e-3, rtol=0)
    torch.testing.assert_close(mean[..., 0], means[..., 0].mean(0))  # steer: the Gaussian law of total variance
    torch.testing.assert_close(epistemic[..., 0], means[..., 0].var(0, unbiased=False))


def test_latent_squash_reaches_either_edge_and_keeps_steer_in_the_box():
    raw = torch.tensor([[-50.0, -50.0, 50.0], [50.0, 0.0, 0.0]])
    latent = squash_latent(raw)
    assert float(latent[0, 1]) == pytest.approx(LATENT_LOW) and float(latent[0, 2]) == pytest.approx(LATENT_HIGH)
    assert torch.all(latent[:, 0].abs() <= 1) and float(latent[1, 1]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="3 action outputs"):
        squash_latent(torch.zeros(2, 2))


# ---------------------------------------------------------------------------------- likelihood


def test_censored_likelihood_is_a_probability_measure_on_the_box():
    mean, variance = torch.tensor(0.2, **float64), torch.tensor(0.09, **float64)

    def nll(y: float) -> float:
        target = torch.tensor([[0.0, y, 0.0]], **float64)
        return float(censored_nll(mean.expand(1, 3), variance.expand(1, 3), target)[0, 1])

    masses = np.exp(-nll(0.0)) + np.exp(-nll(1.0))
    density = integrate.quad(lambda y: np.exp(-nll(y)), 1e-12, 1 - 1e-12)[0]
    assert masses + density == pytest.approx(1.0, abs=1e-7)
    assert np.exp(-nll(0.0)) == pytest.approx(stats.norm.cdf(0, 0.2, 0.3), rel=1e-9)


def test_steer_keeps_the_gaussian_likelihood():
    mean, variance = torch.tensor([[0.3, 0.3, 0.3]], **float64), torch.tensor([[0.04, 0.04, 0.04]], **float64)
    target = torch.tensor([[0.0, 0.0, 0.5]], **float64)
    nll = censored_nll(mean, variance, target)
    assert float(nll[0, 0]) == pytest.approx(-stats.norm.logpdf(0.0, 0.3, 0.2), rel=1e-9)
    assert float(nll[0, 1]) == pytest.approx(-stats.norm.logcdf(0.0, 0.3, 0.2), rel=1e-9)
    assert float(nll[0, 2]) == pytest.approx(-stats.norm.logpdf(0.5, 0.3, 0.2), rel=1e-9)


# ---------------------------------------------------------------------------------- heads


def tiny(model: str) -> ModelConfig:
    from nsacdrive.controllers.encoders import EncoderConfig

    return ModelConfig(model=model, encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4,
                       train_samples=3, predict_samples=4, pedal_likelihood="censored")


@pytest.mark.parametrize("model", ["nsac", "gmle"])
def test_censored_heads_predict_in_the_box_with_their_latent_gaussian(model):
    torch.manual_seed(0)
    controller = build_controller(tiny(model)).eval()
    frames, timestamps = torch.rand(5, 4, 3, 84, 96), torch.arange(4.0).expand(5, 4) * 0.04
    prediction = controller.predict(frames, timestamps, samples=4)
    assert prediction.latent_mean is not None and prediction.latent_variance is not None
    assert torch.all((prediction.mean[:, 1:] >= 0) & (prediction.mean[:, 1:] <= 1))
    assert torch.all(prediction.latent_variance > 0) and torch.all(prediction.aleatoric > 0)
    m, v = clipped_moments(prediction.latent_mean, prediction.latent_variance)
    if model == "gmle":  # one draw: the clipped moments of the latent Gaussian exactly
        torch.testing.assert_close(prediction.mean[:, 1:], m[:, 1:])
        torch.testing.assert_close(prediction.aleatoric[:, 1:], v[:, 1:])
        assert torch.all(prediction.epistemic == 0)


def test_gmle_trains_on_the_distribution_it_predicts():
    torch.manual_seed(0)
    controller = build_controller(tiny("gmle")).eval()
    frames, timestamps = torch.rand(6, 4, 3, 84, 96), torch.arange(4.0).expand(6, 4) * 0.04
    target = torch.tensor([[0.1, 0.0, 0.0], [-0.2, 1.0, 0.0], [0.0, 0.4, 0.2]] * 2)
    loss = controller.training_loss(frames, timestamps, target)["total"]
    prediction = controller.predict(frames, timestamps, samples=1)
    expected = censored_nll(prediction.latent_mean, prediction.latent_variance, target).mean()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_the_censored_likelihood_is_refused_where_it_is_not_implemented():
    with pytest.raises(ValueError, match="implemented for nsac, gmle, not 'mcdropout'"):
        dataclasses.replace(tiny("nsac"), model="mcdropout")
    with pytest.raises(ValueError, match="pedal_likelihood must be one of gaussian, censored"):
        ModelConfig(pedal_likelihood="tobit")


# ---------------------------------------------------------------------------------- scores


def synthetic(n: int, spread_factor: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    mean = np.column_stack([rng.normal(0, 0.5, n), rng.uniform(-0.4, 1.4, n)])
    std = rng.uniform(0.05, 0.4, (n, 2))
    y = mean + std * rng.standard_normal((n, 2))
    y[:, 1] = np.clip(y[:, 1], 0, 1)
    return y, mean, (spread_factor * std) ** 2


def test_calibrated_censored_predictions_score_as_calibrated_and_miscalibrated_ones_do_not():
    y, mean, var = synthetic(20_000)
    assert np.mean(y[:, 1] == 0) > 0.2  # a real point mass
    calibrated = censored_scores(y, mean, var, [False, True])
    assert np.all(calibrated["mace"] < 0.01)
    assert np.all(np.abs(calibrated["coverage_90"] - 0.9) < 3 * np.sqrt(0.09 / 20_000) + 1e-3)
    wide = censored_scores(y, mean, var * 4, [False, True])
    assert np.all(wide["mace"] > 0.05) and np.all(wide["coverage_90"] > 0.95)


def test_censored_crps_is_exact():
    y, mean, var = synthetic(300, seed=1)
    scores = censored_scores(y, mean, var, [False, True])
    assert scores["crps"][0] == pytest.approx(gaussian_crps(y[:, 0], mean[:, 0], np.sqrt(var[:, 0])), rel=1e-12)
    draws = np.clip(mean[:, 1, None] + np.sqrt(var[:, 1, None]) * np.random.default_rng(2).standard_normal((300, 20_000)), 0, 1)
    assert scores["crps"][1] == pytest.approx(sample_crps(y[:, 1], draws), abs=2e-4)


def test_censored_scores_reject_bad_input_with_the_argument_named():
    y, mean, var = synthetic(10)
    with pytest.raises(ValueError, match="censored must be one flag per column"):
        censored_scores(y, mean, var, [True])
    bad = y.copy()
    bad[0, 1] = 1.5
    with pytest.raises(ValueError, match="censored columns must lie in"):
        censored_scores(bad, mean, var, [False, True])
    with pytest.raises(ValueError, match="latent_var"):
        censored_scores(y, mean, -var, [False, True])
