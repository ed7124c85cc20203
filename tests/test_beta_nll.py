"""β-NLL (Seitzer et al. 2022): variance-weighted likelihood terms, so a collapsing output variance
(a constant label) no longer dominates the gradient of the shared features."""

from __future__ import annotations

import math

import pytest
import torch

from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.nsac import NSACOutput
from nsacdrive.controllers.objectives import NSACObjective, beta_weighted_mean, gaussian_nll
from nsacdrive.controllers.registry import build_controller


def gaussian_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(16, 3, generator=generator, dtype=torch.float64)
    log_sigma = torch.randn(16, 3, generator=generator, dtype=torch.float64) - 1
    target = torch.randn(16, 3, generator=generator, dtype=torch.float64)
    return mean, log_sigma, target


def test_beta_zero_is_the_plain_gaussian_nll():
    mean, log_sigma, target = gaussian_batch()
    plain = 0.5 * (math.log(2 * math.pi) + 2 * log_sigma + (target - mean) ** 2 * torch.exp(-2 * log_sigma))
    torch.testing.assert_close(gaussian_nll(mean, log_sigma, target, beta=0.0), plain.mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_mean_gradient_scales_as_variance_to_the_power_beta_minus_one(beta):
    """∂L/∂μ = (μ − y)·σ^{2(β−1)}/N: at β = 1 it is the squared error's, whatever σ is."""
    mean, log_sigma, target = gaussian_batch(1)
    mean.requires_grad_(True)
    gaussian_nll(mean, log_sigma, target, beta=beta).backward()
    expected = (mean.detach() - target) * torch.exp(2 * log_sigma) ** (beta - 1) / mean.numel()
    torch.testing.assert_close(mean.grad, expected, rtol=1e-12, atol=1e-15)


def test_the_weights_carry_no_gradient_so_the_variance_still_learns_its_likelihood():
    mean, log_sigma, target = gaussian_batch(2)
    log_sigma.requires_grad_(True)
    gaussian_nll(mean, log_sigma, target, beta=0.5).backward()
    variance = torch.exp(2 * log_sigma.detach())
    # d/dlogσ of [logσ + (y−μ)²/(2σ²)] = 1 − (y−μ)²/σ², times the held weight σ^{2β}
    expected = (1 - (target - mean) ** 2 / variance) * variance**0.5 / mean.numel()
    torch.testing.assert_close(log_sigma.grad, expected, rtol=1e-12, atol=1e-15)


def test_nsac_objective_weights_its_likelihood_by_the_predictive_variance():
    draws = NSACOutput(torch.randn(5, 8, 3, dtype=torch.float64), torch.randn(5, 8, 3, dtype=torch.float64) - 1, None)
    target = torch.randn(8, 3, dtype=torch.float64)
    plain, weighted = NSACObjective(beta=0.0)(draws, draws, target), NSACObjective(beta=1.0)(draws, draws, target)
    variance = (torch.exp(2 * draws.log_sigma) + 1e-3).mean(0)
    terms = 0.5 * (math.log(2 * math.pi) + torch.log(variance) + (target - draws.mean.mean(0)) ** 2 / variance)
    torch.testing.assert_close(plain.nll, terms.mean(), rtol=1e-12, atol=0)
    torch.testing.assert_close(weighted.nll, beta_weighted_mean(terms, variance, 1.0), rtol=1e-12, atol=0)
    torch.testing.assert_close(weighted.nll, (terms * variance).mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("model", ["nsac", "gmle", "mcdropout", "sdenet", "levy", "ensemble"])
def test_every_gaussian_head_takes_nll_beta_from_the_model_config(model):
    controller = build_controller(ModelConfig(model=model, nll_beta=0.5, members=2))
    heads = [member.head for member in controller.members] if model == "ensemble" else [controller.head]
    for head in heads:
        assert (head.objective.beta if model == "nsac" else head.nll_beta) == 0.5


@pytest.mark.parametrize("model", ["evidential", "nac"])
def test_nll_beta_is_refused_for_heads_without_a_gaussian_likelihood(model):
    with pytest.raises(ValueError, match=f"nll_beta weights a Gaussian likelihood; '{model}' trains another loss"):
        ModelConfig(model=model, nll_beta=0.5)
