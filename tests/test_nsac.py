"""NSAC / NAC invariants (docs/nsac.md#tested-invariants) in corrected and reference modes, and the NSAC objective."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nsacdrive.controllers.circuit_attention import block_topk, exact_topk
from nsacdrive.controllers.nsac import NAC, NSAC, NACConfig, NSACConfig, attention_per_position, decompose, ou_moments
from nsacdrive.controllers.objectives import NSACObjective, frozen_batchnorm_statistics, gaussian_nll, gaussian_perturbation

MODES = ["corrected", "reference"]


def make_nsac(mode: str, **kw) -> NSAC:
    torch.manual_seed(0)
    defaults = dict(input_dim=12, d_model=16, num_heads=4, topk=8, mode=mode)
    return NSAC(NSACConfig(**{**defaults, **kw}))


def inputs(batch: int = 3, length: int = 4, dim: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, length, dim, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("return_sequences", [False, True])
def test_shapes_and_attention_sums_to_one(mode, return_sequences):
    layer = make_nsac(mode, return_sequences=return_sequences, output_dim=3)
    out = layer(inputs(), samples=5, return_internals=True)
    expected = (5, 3, 4, 3) if return_sequences else (5, 3, 3)
    assert out.mean.shape == expected and out.log_sigma.shape == expected
    queries = 4 if return_sequences else 1
    assert out.internals.attention.shape == (5, 3, 4, queries, 4)  # K_eff = min(K, T) = 4
    torch.testing.assert_close(out.internals.attention.sum(-1), torch.ones(5, 3, 4, queries))


def test_attention_per_position_scatters_each_heads_top_k_back_to_frames():
    layer = make_nsac("corrected", topk=3, output_dim=3)  # K < T: heads select different keys
    internals = layer(inputs(batch=2, length=6), samples=4, return_internals=True).internals
    summary = attention_per_position(internals, 6)
    assert summary.shape == (2, 6)
    torch.testing.assert_close(summary.sum(-1), torch.ones(2))  # softmax per head, mean over heads
    weights, index = internals.attention[:, :, :, -1].mean(0), internals.key_index[:, :, -1]
    for b in range(2):  # the same by hand, one head and key at a time
        expected = torch.zeros(6)
        for h in range(index.shape[1]):
            for k in range(index.shape[2]):
                expected[index[b, h, k]] += weights[b, h, k] / index.shape[1]
        torch.testing.assert_close(summary[b], expected)
        unselected = set(range(6)) - set(index[b].flatten().tolist())
        assert all(summary[b, j] == 0 for j in unselected)


@pytest.mark.parametrize("mode", MODES)
def test_last_query_only_equals_slicing_the_full_sequence(mode):
    full = make_nsac(mode, return_sequences=True)
    last = make_nsac(mode, return_sequences=False)
    last.load_state_dict(full.state_dict())
    x = inputs()
    a = full(x, noise=False).mean[:, :, -1]
    b = last(x, noise=False).mean
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_qkv_projection_has_no_cross_time_dependence(mode):
    layer = make_nsac(mode)
    x = inputs()
    y = x.clone()
    y[:, 0] += 5.0
    q_x = layer.core.query(x)[:, -1]
    q_y = layer.core.query(y)[:, -1]
    torch.testing.assert_close(q_x, q_y)
    # and the projection is affine: f(a + b) - f(b) = f(a) - f(0)
    zero = torch.zeros_like(x)
    torch.testing.assert_close(layer.core.query(x + y) - layer.core.query(y), layer.core.query(x) - layer.core.query(zero))


# ------------------------------------------------------------------------------- reference mode


def test_reference_phi_kappa_psi_are_input_independent_constants():
    layer = make_nsac("reference")
    a = layer(inputs(seed=1), return_internals=True).internals
    b = layer(inputs(seed=2) * 3, return_internals=True).internals
    for name in ("phi", "kappa", "psi"):
        values = torch.cat([getattr(a, name).flatten(), getattr(b, name).flatten()])
        assert torch.all(values == values[0]), name
    # at initialisation: φ = 0, κ = ψ = ln 2 (+ε)
    assert a.phi.flatten()[0].item() == 0.0
    assert a.kappa.flatten()[0].item() == pytest.approx(math.log(2), abs=1e-5)


def test_reference_backbone_input_kernel_gradient_is_exactly_zero():
    layer = make_nsac("reference")
    out = layer(inputs(), samples=3)
    (out.mean.sum() + out.log_sigma.sum()).backward()
    assert layer.backbone.input_kernel.grad is not None
    assert torch.count_nonzero(layer.backbone.input_kernel.grad) == 0
    assert torch.count_nonzero(layer.backbone.bias.grad) > 0  # the constants do learn


@pytest.mark.parametrize("mode", MODES)
def test_single_token_makes_nsac_deterministic_and_regulariser_zero(mode):
    layer = make_nsac(mode)
    x = inputs(length=1)
    a, b = layer(x, samples=4), layer(x, samples=4)
    assert torch.equal(a.mean, b.mean)
    assert torch.equal(a.mean[0], a.mean[1])
    terms = NSACObjective()(a, b, torch.zeros(3, 3))
    assert terms.regulariser.item() == 0.0


def test_reference_block_topk_drops_the_tail_key():
    torch.manual_seed(3)
    seen = set()
    for _ in range(50):
        q, k = torch.randn(2, 2, 10, 4), torch.randn(2, 2, 10, 4)
        seen |= set(block_topk(q, k, topk=8).flatten().tolist())
    assert 9 not in seen and seen == set(range(9))


def test_corrected_topk_can_select_every_key():
    q = torch.zeros(1, 1, 1, 4)
    q[..., 0] = 1.0
    for target in range(10):
        k = torch.zeros(1, 1, 10, 4)
        k[0, 0, target, 0] = 5.0
        assert exact_topk(q, k, topk=1, key_mask=None).item() == target


def test_topk_all_keys_when_k_covers_a_perfect_square_and_rules_agree():
    torch.manual_seed(4)
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 9, 4)
    exact = exact_topk(q, k, topk=9, key_mask=None)
    assert torch.equal(exact.sort(-1).values, torch.arange(9).expand(2, 3, 5, 9))
    block = block_topk(q, k, topk=9)  # 3 blocks of 3, all kept: same set of keys
    assert torch.equal(block.sort(-1).values, exact.sort(-1).values)


# ------------------------------------------------------------------------------- corrected mode


def test_corrected_phi_kappa_psi_depend_on_the_input_and_gradients_reach_the_backbone():
    layer = make_nsac("corrected")
    a = layer(inputs(seed=1), return_internals=True).internals
    b = layer(inputs(seed=2), return_internals=True).internals
    for name in ("phi", "kappa", "psi"):
        assert not torch.allclose(getattr(a, name), getattr(b, name)), name
        assert getattr(a, name).std() > 0
    out = layer(inputs(), samples=3)
    (out.mean.sum() + out.log_sigma.sum()).backward()
    grad = layer.backbone.to_inter.weight.grad
    assert grad is not None and torch.count_nonzero(grad) > 0
    for name, param in layer.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


def test_corrected_times_enter_the_gate_and_reference_ignores_them():
    x = inputs()
    t1 = torch.ones(3, 4)
    t2 = torch.linspace(0.1, 2.0, 4).expand(3, 4)
    corrected = make_nsac("corrected")
    a = corrected(x, t1, return_internals=True).internals.effective_time
    b = corrected(x, t2, return_internals=True).internals.effective_time
    assert not torch.allclose(a, b)
    reference = make_nsac("reference")
    a = reference(x, t1, return_internals=True).internals.effective_time
    b = reference(x, t2, return_internals=True).internals.effective_time
    torch.testing.assert_close(a, b)


def test_corrected_masked_keys_get_zero_weight_and_do_not_change_the_output():
    layer = make_nsac("corrected")
    x = inputs(length=5)
    mask = torch.tensor([[True, True, False, True, True]] * 3)
    out = layer(x, key_mask=mask, noise=False, return_internals=True)
    index, attention = out.internals.key_index, out.internals.attention
    masked_weight = attention[0][index == 2]
    assert torch.all(masked_weight == 0)
    y = x.clone()
    y[:, 2] += 10.0  # changing a masked key changes nothing
    torch.testing.assert_close(layer(y, key_mask=mask, noise=False).mean, out.mean)


def test_bad_inputs_raise_clear_errors():
    layer = make_nsac("corrected")
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 12\]"):
        layer(torch.randn(3, 12))
    with pytest.raises(ValueError, match="t must have shape"):
        layer(inputs(), torch.ones(3))
    with pytest.raises(ValueError, match="at least one valid key"):
        layer(inputs(), key_mask=torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="divisible"):
        NSACConfig(input_dim=4, d_model=10, num_heads=4)
    with pytest.raises(ValueError, match="mode"):
        NSACConfig(input_dim=4, mode="fixed")


# ------------------------------------------------------------------------------- OU moments


@pytest.mark.parametrize("mode,a0", [("corrected", 0.0), ("corrected", 0.7), ("reference", 0.0)])
def test_sampled_logits_follow_the_ou_marginal(mode, a0):
    """Empirical logit moments over many draws match μ + bn_mean·σ and bn_std²·σ²."""
    layer = make_nsac(mode, a0=a0, bn_mean=0.3, bn_std=0.8, topk=2)
    x = inputs(batch=1, length=2)
    internals = layer(x, return_internals=True).internals
    mu, sigma = internals.ou_mean, internals.ou_std
    # closed form consistency with a₀: μ = φ + (a₀ − φ) e^{−κτ}
    phi, kappa, tau = internals.phi, internals.kappa, internals.effective_time
    expected_mu = phi + (a0 - phi) * torch.exp(-kappa * tau)
    torch.testing.assert_close(mu, expected_mu)
    # draw logits the way the layer does and compare moments
    draws = 40000
    out = layer(x, samples=draws, return_internals=True)
    logit_gap = torch.log(out.internals.attention[..., 0] / out.internals.attention[..., 1])  # a_0 − a_1
    mean_gap = (mu[..., 0] - mu[..., 1]) + 0.3 * (sigma[..., 0] - sigma[..., 1])
    var_gap = 0.8**2 * (sigma[..., 0] ** 2 + sigma[..., 1] ** 2)
    se_mean = torch.sqrt(var_gap / draws)
    assert torch.all((logit_gap.mean(0) - mean_gap).abs() < 5 * se_mean)
    se_var = var_gap * math.sqrt(2 / draws)
    assert torch.all((logit_gap.var(0) - var_gap).abs() < 5 * se_var)


def test_ou_moments_closed_form_and_stability():
    phi, kappa, psi = torch.tensor(0.5), torch.tensor(2.0), torch.tensor(0.7)
    tau = torch.tensor(0.3)
    mean, std = ou_moments(phi, kappa, psi, tau, a0=-0.2)
    assert float(mean) == pytest.approx(0.5 + (-0.2 - 0.5) * math.exp(-0.6))
    assert float(std) ** 2 == pytest.approx(0.49 / 4 * (1 - math.exp(-1.2)))
    # κ → 0: variance → ψ²τ without cancellation
    _, small = ou_moments(phi, torch.tensor(1e-7, dtype=torch.float64), psi.double(), tau.double())
    assert float(small) ** 2 == pytest.approx(0.49 * 0.3, rel=1e-5)


# ------------------------------------------------------------------------------- batched MC


def test_predict_decomposes_into_aleatoric_and_epistemic():
    layer = make_nsac("corrected")
    x = inputs()
    generator = torch.Generator().manual_seed(7)
    pred = layer.predict(x, samples=16, generator=generator)
    out = layer(x, samples=16, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(pred.mean, out.mean.mean(0))
    torch.testing.assert_close(pred.epistemic, out.mean.var(0, unbiased=False))
    torch.testing.assert_close(pred.aleatoric, torch.exp(2 * out.log_sigma).mean(0))
    torch.testing.assert_close(pred.total, pred.aleatoric + pred.epistemic)
    assert torch.all(pred.epistemic > 0)


def test_batched_draws_match_separate_passes_in_distribution():
    """S draws inside one pass have the same law as S separate passes (same features)."""
    layer = make_nsac("corrected")
    x = inputs(batch=1)
    with torch.no_grad():
        batched = layer(x, samples=4000).mean[:, 0, 0]
        separate = torch.stack([layer(x).mean[0, 0, 0] for _ in range(400)])
    assert abs(float(batched.mean() - separate.mean())) < 4 * float(batched.std()) / math.sqrt(400)
    assert float(batched.std()) == pytest.approx(float(separate.std()), rel=0.2)


# ------------------------------------------------------------------------------- objective


def test_objective_matches_a_hand_computation():
    from nsacdrive.controllers.nsac import NSACOutput

    mean = torch.tensor([[[0.0, 1.0]], [[2.0, 3.0]]])  # S=2, B=1, out=2
    log_sigma = torch.zeros(2, 1, 2)
    clean = NSACOutput(mean, log_sigma)
    perturbed = NSACOutput(torch.tensor([[[0.0, 0.0]], [[4.0, 4.0]]]), log_sigma)
    y = torch.tensor([[1.0, 1.0]])
    terms = NSACObjective(lambda_reg=0.5, epsilon=1e-3)(clean, perturbed, y)
    v = 1.0 + 1e-3
    mean_bar = np.array([1.0, 2.0])
    nll = np.mean(0.5 * (np.log(2 * np.pi) + np.log(v) + (np.array([1.0, 1.0]) - mean_bar) ** 2 / v))
    e_id, e_ood = 1.0, 4.0
    reg = np.log1p(e_id / (e_ood + 1e-3))
    assert float(terms.nll) == pytest.approx(nll)
    assert float(terms.regulariser) == pytest.approx(reg)
    assert float(terms.total) == pytest.approx(nll + 0.5 * reg)
    # one draw: no spread, no regulariser
    one = NSACOutput(mean[:1], log_sigma[:1])
    assert float(NSACObjective()(one, one, y).regulariser) == 0.0


def test_targets_shaped_b_raise_instead_of_broadcasting():
    layer = make_nsac("corrected", output_dim=1)
    out = layer(inputs(), samples=3)
    with pytest.raises(ValueError, match=r"targets must be shaped \[B, out\]"):
        NSACObjective()(out, out, torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[B, out\]"):
        gaussian_nll(out.mean[0], out.log_sigma[0], torch.zeros(3))


def test_objective_trains_end_to_end_and_gradients_are_finite():
    layer = make_nsac("corrected", output_dim=2)
    x, y = inputs(batch=8), torch.randn(8, 2)
    clean = layer(x, samples=4)
    perturbed = layer(gaussian_perturbation(x, 0.0, 5.0, torch.Generator().manual_seed(0)), samples=4)
    NSACObjective()(clean, perturbed, y).total.backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def test_perturbed_passes_leave_batchnorm_statistics_alone():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    net.train()
    net(torch.randn(16, 4))
    before = (net[1].running_mean.clone(), net[1].running_var.clone(), int(net[1].num_batches_tracked))
    with frozen_batchnorm_statistics(net):
        net(torch.randn(16, 4) * 10 + 3)
    assert torch.equal(net[1].running_mean, before[0]) and torch.equal(net[1].running_var, before[1])
    assert int(net[1].num_batches_tracked) == before[2]


def test_decompose_single_draw_has_zero_epistemic():
    pred = decompose(torch.randn(1, 4, 3), torch.zeros(1, 4, 3))
    assert torch.all(pred.epistemic == 0) and torch.allclose(pred.aleatoric, torch.ones(4, 3))


# ------------------------------------------------------------------------------- NAC


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("solver", ["exact", "steady", "euler"])
def test_nac_is_deterministic_and_shaped(mode, solver):
    torch.manual_seed(0)
    layer = NAC(NACConfig(input_dim=12, d_model=16, num_heads=4, mode=mode, solver=solver))
    x = inputs()
    out, attention = layer(x, return_attention=True)
    assert out.shape == (3, 16)
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, 4, 1))
    assert torch.equal(layer(x), out)


def test_nac_exact_logits_follow_the_ode_solution():
    layer = NAC(NACConfig(input_dim=4, d_model=8, num_heads=2))
    phi, rate, tau = torch.tensor(0.4), torch.tensor(1.5), torch.tensor(0.6)
    assert float(layer.logits(phi, rate, tau)) == pytest.approx(0.4 / 1.5 * (1 - math.exp(-0.9)))


def test_nsac_head_predictions_carry_the_attention_summary():
    from nsacdrive.controllers.heads import NSACHead

    torch.manual_seed(0)
    head = NSACHead(NSACConfig(input_dim=12, d_model=16, num_heads=4, topk=8, output_dim=3))
    prediction = head.predict(inputs(batch=2, length=4), torch.ones(2, 4), samples=5)
    assert prediction.attention.shape == (2, 4)
    torch.testing.assert_close(prediction.attention.sum(-1), torch.ones(2))
