"""NSAC's hinge regulariser and the held-out OOD proxies of its perturbed twins."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.nsac import NSACOutput
from nsacdrive.controllers.objectives import NSACObjective
from nsacdrive.controllers.ood_proxies import GRID, PROXY_FAMILIES, blend_with_other, make_perturbation, shuffle_cells, twin_count


def draws(means: list[list[list[float]]], requires_grad: bool = False) -> NSACOutput:
    mean = torch.tensor(means, requires_grad=requires_grad)  # [S, B, out]
    return NSACOutput(mean, torch.zeros_like(mean))


# ---------------------------------------------------------------------------------- hinge


def test_hinge_matches_a_hand_computation_per_sequence():
    # S = 2, B = 2, out = 2; Var over two draws a, b is ((a − b)/2)²
    clean = draws([[[0.0, 0.0], [0.0, 0.0]], [[0.2, 0.0], [0.0, 0.0]]])      # e_id = (0.01 + 0)/2, 0
    perturbed = draws([[[0.0, 0.0], [0.0, 0.0]], [[0.4, 0.4], [0.1, 0.0]]])  # e_ood = 0.04, 0.0025/2
    terms = NSACObjective(regulariser="hinge", margin=0.1)(clean, perturbed, torch.zeros(2, 2))
    rms = lambda variance: (torch.tensor(variance, dtype=torch.float64) + 1e-10).sqrt()  # noqa: E731  (the objective's ε under √)
    expected = torch.relu(0.1 - (rms([0.04, 0.00125]) - rms([0.005, 0.0]))).mean()  # 0.1 − 0.129 < 0 → 0, and 0.1 − 0.035
    assert float(terms.regulariser) == pytest.approx(float(expected), rel=1e-5)
    assert float(expected) == pytest.approx((0.1 - 0.00125**0.5) / 2, rel=1e-3)
    # the logged batch means are the same quantities as the ratio's
    assert float(terms.epistemic_id) == pytest.approx(0.0025, rel=1e-5)
    assert float(terms.epistemic_ood) == pytest.approx((0.04 + 0.00125) / 2, rel=1e-5)


def test_once_the_margin_is_met_the_hinge_no_longer_rewards_collapsing_the_clean_spread():
    clean = draws([[[0.0]], [[0.2]]], requires_grad=True)  # r_id = 0.1
    perturbed = draws([[[0.0]], [[1.0]]])                   # r_ood = 0.5 ≫ r_id + m
    hinge = NSACObjective(regulariser="hinge", margin=0.05)(clean, perturbed, torch.zeros(1, 1)).regulariser
    assert float(hinge.detach()) == 0.0
    (grad_hinge,) = torch.autograd.grad(hinge, clean.mean)
    assert torch.count_nonzero(grad_hinge) == 0
    # the published ratio keeps pushing the clean spread down whatever the spread off it
    ratio = NSACObjective()(clean, perturbed, torch.zeros(1, 1)).regulariser
    (grad_ratio,) = torch.autograd.grad(ratio, clean.mean)
    assert float(grad_ratio.abs().sum()) > 0


def test_the_hinge_pushes_twins_apart_while_the_margin_is_not_met():
    # and, unlike a hinge on variances, still does so when both spreads are nearly zero
    tiny = NSACObjective(regulariser="hinge", margin=0.05)
    still = draws([[[0.0]], [[1e-6]]], requires_grad=True)
    (grad_tiny,) = torch.autograd.grad(tiny(draws([[[0.0]], [[0.0]]]), still, torch.zeros(1, 1)).regulariser, still.mean)
    variance_gradient = 2 * 0.5e-6 / 2  # ∂Var_s/∂μ_s = 2(μ_s − μ̄)/S: what a hinge on variances would get
    assert float(grad_tiny.abs().max()) > 1e4 * variance_gradient
    clean = draws([[[0.0]], [[0.2]]])
    perturbed = draws([[[0.0]], [[0.2]]], requires_grad=True)  # same spread: margin unmet
    hinge = NSACObjective(regulariser="hinge", margin=0.05)(clean, perturbed, torch.zeros(1, 1)).regulariser
    assert float(hinge.detach()) == pytest.approx(0.05, abs=1e-6)
    (grad,) = torch.autograd.grad(hinge, perturbed.mean)
    # descending the gradient widens the twin's draws: the upper draw moves up, the lower down
    assert float(grad[1, 0, 0]) < 0 < float(grad[0, 0, 0])


def test_bad_regulariser_settings_raise_naming_the_field():
    with pytest.raises(ValueError, match="regulariser must be one of ratio, hinge"):
        NSACObjective(regulariser="square")
    with pytest.raises(ValueError, match="margin"):
        NSACObjective(regulariser="hinge", margin=-1.0)
    with pytest.raises(ValueError, match="epistemic_regulariser"):
        ModelConfig(epistemic_regulariser="square")
    with pytest.raises(ValueError, match="epistemic_margin"):
        ModelConfig(epistemic_margin=-0.1)


# ---------------------------------------------------------------------------------- proxies


def frames(batch: int = 6, length: int = 3, height: int = 96, width: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, length, 3, height, width, generator=torch.Generator().manual_seed(seed))


def cells(x: torch.Tensor) -> torch.Tensor:
    """[T, C, H, W] → its GRID² cells [GRID², T, C, h, w]."""
    t, c, h, w = x.shape
    ch, cw = h // GRID, w // GRID
    return x[..., : GRID * ch, : GRID * cw].reshape(t, c, GRID, ch, GRID, cw).permute(2, 4, 0, 1, 3, 5).reshape(GRID * GRID, t, c, ch, cw)


@settings(max_examples=20, deadline=None)
@given(height=st.integers(GRID, 40), width=st.integers(GRID, 40), seed=st.integers(0, 2**16))
def test_shuffle_permutes_whole_cells_alike_in_every_frame_and_keeps_the_margin(height, width, seed):
    x = frames(batch=3, length=2, height=height, width=width, seed=seed)
    out = shuffle_cells(x, torch.Generator().manual_seed(seed))
    ch, cw = height // GRID, width // GRID
    for b in range(x.shape[0]):
        before, after = cells(x[b]), cells(out[b])
        # every output cell is an input cell (all T frames and channels together): a permutation
        match = (after[:, None] == before[None]).flatten(2).all(-1)  # [out cell, in cell]
        assert torch.equal(match.sum(1), torch.ones(GRID * GRID, dtype=torch.long))
        assert torch.equal(match.sum(0), torch.ones(GRID * GRID, dtype=torch.long))
    assert torch.equal(out[..., GRID * ch:, :], x[..., GRID * ch:, :])
    assert torch.equal(out[..., GRID * cw:], x[..., GRID * cw:])


def test_shuffle_refuses_frames_smaller_than_its_grid():
    with pytest.raises(ValueError, match="too small"):
        shuffle_cells(frames(height=3, width=96), torch.Generator())


def test_blend_is_a_near_even_mix_with_the_next_sequence():
    x = frames()
    out = blend_with_other(x, torch.Generator().manual_seed(1))
    other = x.roll(1, dims=0)
    weight = ((out - other) * (x - other)).flatten(1).sum(1) / (x - other).square().flatten(1).sum(1)
    assert torch.all((weight >= 0.4 - 1e-5) & (weight <= 0.6 + 1e-5))
    torch.testing.assert_close(out, weight.view(-1, 1, 1, 1, 1) * x + (1 - weight.view(-1, 1, 1, 1, 1)) * other)


def test_proxies_give_each_sequence_one_family_and_a_seed_repeats_them():
    x = frames(batch=48, length=2, height=16, width=16)
    perturb = make_perturbation("proxies", torch.Generator().manual_seed(5), noise_mean=0.0, noise_std=0.0)  # noise → identity
    out = perturb(x)
    again = make_perturbation("proxies", torch.Generator().manual_seed(5), 0.0, 0.0)(x)
    assert torch.equal(out, again)
    families = []
    for b in range(x.shape[0]):
        if torch.equal(out[b], x[b]):
            families.append("noise")
        elif torch.equal(out[b].flatten().sort().values, x[b].flatten().sort().values):
            families.append("shuffle")
        else:
            lo, hi = torch.minimum(x[b], x[b - 1]), torch.maximum(x[b], x[b - 1])
            assert torch.all((out[b] >= lo - 1e-6) & (out[b] <= hi + 1e-6))
            families.append("blend")
    assert set(families) == set(PROXY_FAMILIES)


def test_noise_perturbation_is_the_published_gaussian_and_unknown_kinds_raise():
    x = torch.zeros(64, 2, 3, 16, 16)
    out = make_perturbation("noise", torch.Generator().manual_seed(0), noise_mean=0.5, noise_std=0.2)(x)
    assert float(out.mean()) == pytest.approx(0.5, abs=0.01) and float(out.std()) == pytest.approx(0.2, rel=0.02)
    with pytest.raises(ValueError, match="perturbation must be one of noise, proxies"):
        make_perturbation("mixup", torch.Generator(), 0.0, 0.2)


# ---------------------------------------------------------------------------------- twin fraction


@pytest.mark.parametrize("batch, fraction, expected", [(32, 1.0, 32), (32, 0.25, 8), (32, 0.01, 1), (5, 0.5, 2)])
def test_twin_count_rounds_the_share_of_the_batch_and_keeps_at_least_one(batch, fraction, expected):
    assert twin_count(batch, fraction) == expected


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_a_twin_fraction_outside_0_1_raises_when_the_perturbation_is_made(fraction):
    with pytest.raises(ValueError, match=r"twin fraction must be in \(0, 1\]"):
        make_perturbation("noise", torch.Generator(), 0.0, 0.2, fraction)


def test_fewer_twins_are_the_first_sequences_with_the_same_noise_as_a_full_twin_batch():
    x = frames(batch=16, length=2, height=8, width=8)
    full = make_perturbation("noise", torch.Generator().manual_seed(4), 0.0, 0.2)(x)
    quarter = make_perturbation("noise", torch.Generator().manual_seed(4), 0.0, 0.2, fraction=0.25)(x)
    assert quarter.shape == (4, *x.shape[1:])
    assert torch.equal(quarter, full[:4])  # the generator fills the first rows first


def test_the_hinge_pairs_fewer_twins_with_the_first_clean_sequences_and_the_nll_keeps_the_whole_batch():
    generator = torch.Generator().manual_seed(0)
    clean = NSACOutput(torch.randn(5, 8, 3, generator=generator), 0.1 * torch.randn(5, 8, 3, generator=generator))
    twins = NSACOutput(torch.randn(5, 3, 3, generator=generator), torch.zeros(5, 3, 3))
    target = torch.randn(8, 3, generator=generator)
    objective = NSACObjective(regulariser="hinge", margin=2.0)
    terms = objective(clean, twins, target)
    first = objective(NSACOutput(clean.mean[:, :3], clean.log_sigma[:, :3]), twins, target[:3])
    assert float(terms.regulariser) == pytest.approx(float(first.regulariser), rel=1e-6)
    assert float(terms.nll) == pytest.approx(float(objective(clean, clean, target).nll), rel=1e-6)
    assert float(terms.nll) != pytest.approx(float(first.nll), rel=1e-3)


@pytest.mark.parametrize("model", ["nsac", "sdenet"])
def test_heads_train_on_fewer_twins_with_their_speeds_and_times(model):
    from nsacdrive.controllers.registry import build_controller
    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model=model, speed_input=True)).train()
    batch = 6
    frames_in = torch.rand(batch, 2, 3, 84, 96)
    timestamps = torch.tensor([[-0.04, 0.0]]).expand(batch, 2)
    perturb = make_perturbation("noise", torch.Generator().manual_seed(1), 0.0, 0.2, fraction=0.5)
    terms = controller.training_loss(frames_in, timestamps, torch.rand(batch, 3), perturb=perturb, speed=torch.rand(batch, 2))
    terms["total"].backward()
    assert torch.isfinite(terms["total"])
    assert all(p.grad is not None for p in controller.encoder.parameters())
