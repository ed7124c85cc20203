"""Lévy attention (controllers/levy.py) and its calibration (controllers/levy_calibration.py).

Mirrors the numerical checks listed in docs/levy.md#numerical-checks: φ against a 50-digit reference and
scipy, Theorems 1 and 2 by Monte Carlo with the layer's own sampler, evidence against grid
resolution, τ as an intensity multiplier, the mean path against an independent float64
implementation of the cell form (numpy + scipy), and the centred disagreement against the
cancelling shortcut in float32. Monte Carlo tolerances are 4 standard errors of the estimate,
with fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math

import mpmath
import numpy as np
import pytest
import scipy.special as sps
import torch

import nsacdrive.controllers.levy as levy_module
from nsacdrive.controllers.levy import (
    LevyActionHead,
    LevyActionHeadConfig,
    LevyAttentionConfig,
    LevyCrossAttention,
    _axis_mass,
    fourier_time_features,
    levy_phi,
)
from nsacdrive.controllers.levy_calibration import (
    conformal_interval,
    conformal_quantile,
    conformal_scores,
    fit_affine_scale,
    gaussian_interval,
)

DRAWS = 20_000

# --------------------------------------------------------------------------- helpers


def make_layer(
    heads: int = 1, head_dim: int = 8, identity_dim: int = 4, seed: int = 0, dtype=torch.float64, **config
) -> LevyCrossAttention:
    torch.manual_seed(seed)
    cfg = LevyAttentionConfig(embed_dim=heads * head_dim, num_heads=heads, identity_dim=identity_dim, **config)
    return LevyCrossAttention(cfg).to(dtype)


def with_config(layer: LevyCrossAttention, **changes) -> LevyCrossAttention:
    """Same parameters, other settings (τ, grid, chunking)."""
    other = LevyCrossAttention(dataclasses.replace(layer.config, **changes)).to(layer.q_proj.weight.dtype)
    other.load_state_dict(layer.state_dict())
    return other


def identity_projection(layer: LevyCrossAttention) -> None:
    """W_O = I, bias 0: the output is the concatenation of the per-head mean paths."""
    with torch.no_grad():
        layer.out_proj.weight.copy_(torch.eye(layer.config.embed_dim))
        layer.out_proj.bias.zero_()


def make_inputs(
    layer: LevyCrossAttention, batch: int = 1, keys: int = 48, queries: int = 3, seed: int = 1, per_sample_identity: bool = False
):
    g = torch.Generator().manual_seed(seed)
    cfg, dtype = layer.config, layer.q_proj.weight.dtype
    q = torch.randn(batch, queries, cfg.embed_dim, generator=g, dtype=dtype)
    x = torch.randn(batch, keys, cfg.embed_dim, generator=g, dtype=dtype)
    t = torch.rand(batch, keys, generator=g, dtype=dtype)
    shape = (batch, keys, cfg.identity_dim) if per_sample_identity else (keys, cfg.identity_dim)
    e = torch.randn(*shape, generator=g, dtype=dtype)
    return q, x, t, e


def numpy_params(layer: LevyCrossAttention, dtype=np.float64) -> dict[str, np.ndarray]:
    return {name: p.detach().double().numpy().astype(dtype) for name, p in layer.named_parameters()}


def reference_cell_form(layer, queries, tokens, times, identity, mask=None, dtype=np.float64):
    """The cell form of docs/levy.md#mean-path, written independently in numpy/scipy, one (sample, head) at a time.

    Padded keys are dropped. Returns per-head ā [B, H, m, d], Λ, trΣ_V (direct form) [B, H, m],
    the shortcut trΣ_V, λ [B, H, m, L], V [B, H, L, d] and the projected output [B, m, E].
    """
    cfg = layer.config
    prm = numpy_params(layer, dtype)
    (l_t, l_v), (eps_t, eps_v) = cfg.grid, cfg.eps
    h, d = cfg.num_heads, cfg.head_dim
    q_all = queries.detach().double().numpy().astype(dtype)
    x_all = tokens.detach().double().numpy().astype(dtype)
    t_all = times.detach().double().numpy().astype(dtype)
    e_all = identity.detach().double().numpy().astype(dtype)
    b_size, m = q_all.shape[:2]
    mask_np = np.ones(t_all.shape, bool) if mask is None else mask.numpy()
    ct = ((np.arange(l_t) + 0.5) / l_t).astype(dtype)
    cu = ((np.arange(l_v) + 0.5) / l_v).astype(dtype)
    centres_t, centres_u = np.repeat(ct, l_v), np.tile(cu, l_t)  # flat l = j·Lv + k
    out = {k: [] for k in ("abar", "evidence", "disagreement", "shortcut", "rates", "field")}
    for b in range(b_size):
        valid = mask_np[b]
        x, t = x_all[b][valid], t_all[b][valid]
        e = (e_all[b] if e_all.ndim == 3 else e_all)[valid]
        q = q_all[b] @ prm["q_proj.weight"].T + prm["q_proj.bias"]
        k = x @ prm["k_proj.weight"].T + prm["k_proj.bias"]
        v = x @ prm["v_proj.weight"].T + prm["v_proj.bias"]
        u_all = sps.expit(e @ prm["chan.weight"].T + prm["chan.bias"])
        per_head = {key: [] for key in out}
        for head in range(h):
            sl = slice(head * d, (head + 1) * d)
            u = u_all[:, head]
            mass_t = sps.ndtr((np.linspace(0, 1, l_t + 1, dtype=dtype)[None, 1:] - t[:, None]) / eps_t) - sps.ndtr(
                (np.linspace(0, 1, l_t + 1, dtype=dtype)[None, :-1] - t[:, None]) / eps_t
            )
            mass_u = sps.ndtr((np.linspace(0, 1, l_v + 1, dtype=dtype)[None, 1:] - u[:, None]) / eps_v) - sps.ndtr(
                (np.linspace(0, 1, l_v + 1, dtype=dtype)[None, :-1] - u[:, None]) / eps_v
            )
            z_t, z_u = mass_t.sum(1), mass_u.sum(1)
            mass = ((mass_t / z_t[:, None])[:, :, None] * (mass_u / z_u[:, None])[:, None, :]).reshape(len(t), -1)
            dist = ((centres_t[:, None] - t[None]) / eps_t) ** 2 + ((centres_u[:, None] - u[None]) / eps_v) ** 2
            weights = sps.softmax(-0.5 * dist - np.log(z_t * z_u)[None], axis=1)  # [L, n]
            field = weights @ v[:, sl]
            qn = q[:, sl] / np.linalg.norm(q[:, sl], axis=1, keepdims=True)
            kn = k[:, sl] / np.linalg.norm(k[:, sl], axis=1, keepdims=True)
            kappa = cfg.tau * np.exp(cfg.beta * qn @ kn.T)
            rates = kappa @ mass
            evidence = rates.sum(1)
            p = rates / evidence[:, None]
            abar = p @ field
            direct = (p * ((field[None] - abar[:, None]) ** 2).sum(-1)).sum(1)
            shortcut = p @ (field**2).sum(-1) - (abar**2).sum(-1)
            for key, val in zip(out, (abar, evidence, direct, shortcut, rates, field)):
                per_head[key].append(val)
        for key in out:
            out[key].append(np.stack(per_head[key]))
    res = {key: np.stack(val) for key, val in out.items()}
    concat = res["abar"].transpose(0, 2, 1, 3).reshape(b_size, m, h * d)
    res["output"] = concat @ prm["out_proj.weight"].T + prm["out_proj.bias"]
    return res


def phi_mpmath(lam: float) -> float:
    with mpmath.workdps(50):
        x = mpmath.mpf(lam)
        return float(mpmath.exp(-x) * (mpmath.ei(x) - mpmath.euler - mpmath.log(x)))


# --------------------------------------------------------------------------- φ


def test_phi_zero_and_small_lambda_expansion():
    assert levy_phi(torch.tensor(0.0, dtype=torch.float64)).item() == 0.0
    lam = torch.tensor([1e-6, 1e-4, 1e-3, 1e-2], dtype=torch.float64)
    # φ = Λ − ¾Λ² + (11/36)Λ³ + O(Λ⁴)
    assert torch.all((levy_phi(lam) - (lam - 0.75 * lam**2)).abs() <= 0.31 * lam**3 + 1e-18)


def test_phi_maximum():
    lam = torch.linspace(1.3, 1.7, 40_001, dtype=torch.float64)
    phi = levy_phi(lam)
    best = int(phi.argmax())
    assert phi[best].item() == pytest.approx(0.51735, abs=5e-6)
    assert lam[best].item() == pytest.approx(1.5029, abs=5e-4)
    # at the maximum φ' = 0, i.e. φ = (1 − e^{-Λ})/Λ: the difference changes sign there
    gap = phi - (1 - torch.exp(-lam)) / lam
    assert gap[best - 10] < 0 < gap[best + 10]
    # strictly decreasing after the peak
    tail = levy_phi(torch.logspace(math.log10(1.6), 4, 2000, dtype=torch.float64))
    assert torch.all(tail[1:] < tail[:-1])


@pytest.mark.parametrize(
    "lam, expected, tol",
    [
        (1, 0.485, 5e-4),
        (2, 0.997, 5e-4),
        (5, 1.280, 5e-4),
        (10, 1.130, 5e-4),
        (28, 1.0386, 5e-5),
        (62, 1.0167, 5e-5),
        (632, 1.0016, 5e-5),
        (1e4, 1.0001, 5e-5),
    ],
)
def test_lambda_phi_values(lam, expected, tol):
    assert lam * levy_phi(torch.tensor(float(lam), dtype=torch.float64)).item() == pytest.approx(expected, abs=tol)


def test_phi_matches_50_digit_reference_and_scipy():
    grid = np.logspace(-6, 4, 241)
    ours = levy_phi(torch.tensor(grid, dtype=torch.float64)).numpy()
    reference = np.array([phi_mpmath(x) for x in grid])
    assert np.max(np.abs(ours / reference - 1)) < 1e-10
    # scipy's Ei: e^{-Λ}(Ei(Λ) − γ − ln Λ); below 1e-3 it cancels, above ~700 Ei overflows
    moderate = grid[(grid >= 1e-3) & (grid <= 700)]
    via_scipy = np.exp(-moderate) * (sps.expi(moderate) - np.euler_gamma - np.log(moderate))
    assert np.max(np.abs(levy_phi(torch.tensor(moderate)).numpy() / via_scipy - 1)) < 1e-10


def test_phi_gradients_finite_and_exact_including_branch_switch():
    lam = torch.tensor(
        [0.0, 1e-300, 1e-8, 0.3, 1.5029, 39.999999, 40.0, 40.000001, 632.0, 1e4], dtype=torch.float64, requires_grad=True
    )
    phi = levy_phi(lam)
    (grad,) = torch.autograd.grad(phi.sum(), lam)
    assert torch.isfinite(grad).all()
    x = lam.detach()
    # φ' = −φ + (1 − e^{-Λ})/Λ, → 1 as Λ → 0
    expected = torch.where(x > 0, -phi.detach() + (-torch.expm1(-x)) / x.clamp(min=1e-300), torch.ones_like(x))
    assert torch.allclose(grad, expected, rtol=1e-8, atol=1e-15)
    # continuity at the switch between the two branches (the K = 12 series is good to ~1e-11 there)
    below, above = levy_phi(torch.tensor([40 - 1e-12, 40.0], dtype=torch.float64))
    assert abs(below.item() - above.item()) < 1e-12


def test_phi_dtype_round_trip():
    assert levy_phi(torch.tensor([1.0, 50.0])).dtype == torch.float32
    assert levy_phi(torch.tensor([1, 50])).dtype == torch.float64


# --------------------------------------------------------------------------- geometry


def test_axis_mass_rows_sum_to_one_and_match_exact_integrals():
    x = torch.tensor([0.0, 1e-9, 0.03, 0.5, 0.97, 1.0], dtype=torch.float64)
    for cells, eps in ((16, 1 / 16), (8, 1 / 8), (64, 1 / 16)):
        mass, log_z = _axis_mass(x, cells, eps)
        assert torch.allclose(mass.sum(-1), torch.ones_like(x), atol=1e-15)
        edges = np.linspace(0, 1, cells + 1)
        raw = sps.ndtr((edges[None, 1:] - x.numpy()[:, None]) / eps) - sps.ndtr((edges[None, :-1] - x.numpy()[:, None]) / eps)
        assert np.allclose(mass.numpy(), raw / raw.sum(1, keepdims=True), rtol=1e-12, atol=1e-15)
        # log Z: the in-[0,1] mass, 1/2 on the boundary
        assert np.allclose(log_z.exp().numpy(), sps.ndtr((1 - x.numpy()) / eps) - sps.ndtr(-x.numpy() / eps), rtol=1e-13)
        # far right of a key at 0 the tiny masses are still exact (upper tails, no Φ ≈ 1 cancellation)
        far = (sps.ndtr(-edges[-2] / eps) - sps.ndtr(-1 / eps)) / (0.5 - sps.ndtr(-1 / eps))
        assert mass[0, -1].item() == pytest.approx(far, rel=1e-10)


def test_mean_path_and_signals_match_independent_cell_form():
    """ā = Σ_l p_l V_l (= Σ_i π_i ṽ_i), Λ = Σ_l λ_l, trΣ_V direct, σ̂ = sqrt(trΣ_V φ(Λ))."""
    layer = make_layer(heads=2, head_dim=4, identity_dim=3)
    q, x, t, e = make_inputs(layer, batch=2, keys=20, queries=4, per_sample_identity=True)
    t[0, :3] = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)  # keys on the boundary
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 5:9] = False
    out = layer(q, x, t, e, mask)
    ref = reference_cell_form(layer, q, x, t, e, mask)
    assert np.allclose(out.output.detach().numpy(), ref["output"], rtol=1e-10, atol=1e-12)
    heads = lambda f: f.detach().numpy().transpose(0, 2, 1)  # noqa: E731  [B, m, H] -> [B, H, m]
    assert np.allclose(heads(out.evidence_heads), ref["evidence"], rtol=1e-12)
    assert np.allclose(heads(out.disagreement_heads), ref["disagreement"], rtol=1e-9, atol=1e-14)
    phi = levy_phi(torch.tensor(ref["evidence"])).numpy()
    assert np.allclose(heads(out.deviation_heads), np.sqrt(ref["disagreement"] * phi), rtol=1e-9)
    assert np.allclose(out.evidence.detach().numpy(), ref["evidence"].mean(1), rtol=1e-12)
    rates = layer.cell_intensity(q, x, t, e, mask).detach().numpy()
    assert np.allclose(rates, ref["rates"], rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("grid", [(8, 4), (16, 8), (32, 16), (64, 32)])
def test_evidence_is_grid_independent(grid):
    """Λ = τ Σ_i κ_i on every grid, with keys on the boundary of S (docs/levy.md#evidence)."""
    base = make_layer(heads=2, head_dim=4, identity_dim=3, tau=0.7)
    with torch.no_grad():
        base.chan.weight.mul_(25.0)  # push u towards 0 and 1
    layer = with_config(base, grid=grid)
    q, x, t, e = make_inputs(layer, keys=30, queries=5)
    t[0, :4] = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    out = layer(q, x, t, e)
    prm = numpy_params(layer)
    qp = (q[0].numpy() @ prm["q_proj.weight"].T + prm["q_proj.bias"]).reshape(5, 2, 4)
    kp = (x[0].numpy() @ prm["k_proj.weight"].T + prm["k_proj.bias"]).reshape(30, 2, 4)
    qp /= np.linalg.norm(qp, axis=-1, keepdims=True)
    kp /= np.linalg.norm(kp, axis=-1, keepdims=True)
    expected = 0.7 * np.exp(np.einsum("mhd,nhd->mhn", qp, kp)).sum(-1)  # [m, H]
    assert np.allclose(out.evidence_heads[0].detach().numpy(), expected, rtol=1e-12)
    rates = layer.cell_intensity(q, x, t, e)
    assert rates.shape[-1] == grid[0] * grid[1]
    assert torch.allclose(rates.sum(-1)[0].T, out.evidence_heads[0], rtol=1e-12)
    u = torch.sigmoid(layer.chan(e))
    assert (u < 1e-3).any() and (u > 1 - 1e-3).any()


def test_grid_moves_the_mean_path_but_not_the_evidence():
    base = make_layer(heads=1, head_dim=8)
    q, x, t, e = make_inputs(base)
    coarse, fine = (with_config(base, grid=g)(q, x, t, e) for g in ((8, 4), (64, 32)))
    assert torch.allclose(coarse.evidence, fine.evidence, rtol=1e-12)
    assert (coarse.output - fine.output).abs().max() > 1e-6


@pytest.mark.parametrize("tau", [0.1, 0.5, 2.0])
def test_tau_is_an_intensity_multiplier(tau):
    """τ cancels from ā and trΣ_V, scales Λ by τ, and σ̂ follows φ(τΛ) (docs/levy.md#kernel)."""
    layer = make_layer(heads=2, head_dim=4)
    q, x, t, e = make_inputs(layer)
    one, scaled = layer(q, x, t, e), with_config(layer, tau=tau)(q, x, t, e)
    assert torch.allclose(scaled.output, one.output, rtol=0, atol=1e-14)
    assert torch.allclose(scaled.disagreement_heads, one.disagreement_heads, rtol=1e-13)
    assert torch.allclose(scaled.evidence_heads, tau * one.evidence_heads, rtol=1e-13)
    ratio = torch.sqrt(levy_phi(tau * one.evidence_heads) / levy_phi(one.evidence_heads))
    assert torch.allclose(scaled.deviation_heads, one.deviation_heads * ratio, rtol=1e-12)


def test_identical_values_have_zero_disagreement():
    layer = make_layer(heads=2, head_dim=4)
    with torch.no_grad():
        layer.v_proj.weight.zero_()
        layer.v_proj.bias.copy_(torch.linspace(-3, 5, 8))
    q, x, t, e = make_inputs(layer)
    q.requires_grad_(True)
    out = layer(q, x, t, e)
    assert out.disagreement.abs().max() < 1e-24
    assert out.deviation.max() < 1e-12
    assert out.evidence.min() > 1.0  # Λ is large, yet there is nothing to disagree about
    (grad,) = torch.autograd.grad(out.deviation.sum() + out.output.sum(), q)
    assert torch.isfinite(grad).all()


def test_centred_disagreement_survives_a_large_value_offset_in_float32():
    """The shortcut Σp‖V‖² − ‖ā‖² cancels in float32 at offset 100; the layer's centred form does not."""
    layer32 = make_layer(heads=1, head_dim=8, dtype=torch.float32)
    with torch.no_grad():
        layer32.v_proj.weight.mul_(0.1)
        layer32.v_proj.bias.add_(100.0)
    q, x, t, e = make_inputs(layer32)
    truth = reference_cell_form(layer32, q, x, t, e)["disagreement"][:, 0]  # float64
    ours = layer32(q, x, t, e).disagreement.detach().double().numpy()
    shortcut = reference_cell_form(layer32, q, x, t, e, dtype=np.float32)["shortcut"][:, 0]
    our_error = np.max(np.abs(ours / truth - 1))
    shortcut_error = np.max(np.abs(shortcut / truth - 1))
    assert our_error < 5e-4
    assert shortcut_error > 10 * our_error


# --------------------------------------------------------------------------- sampling (Theorems 1 and 2)


def monte_carlo_setup(target: float, heads: int = 1, head_dim: int = 8, seed: int = 0):
    layer = make_layer(heads=heads, head_dim=head_dim, seed=seed)
    identity_projection(layer)
    q, x, t, e = make_inputs(layer, keys=48, queries=3, seed=seed + 1)
    evidence = layer(q, x, t, e).evidence_heads
    layer = with_config(layer, tau=target / evidence.mean().item())
    return layer, (q, x, t, e)


@pytest.mark.parametrize("target", [0.3, 1.5, 5.0, 50.0])
def test_theorems_1_and_2_by_monte_carlo(target):
    layer, inputs = monte_carlo_setup(target)
    with torch.no_grad():
        out = layer(*inputs)
    abar = out.output[0]  # W_O = I: the head's ā, [m, d]
    draws = layer.sample(*inputs, draws=DRAWS, generator=torch.Generator().manual_seed(7))[:, 0]  # [K, m, d]
    assert draws.shape == (DRAWS, 3, 8) and not draws.requires_grad
    lam = out.evidence[0]
    predicted = out.disagreement[0] * levy_phi(lam)

    # no count falls with probability e^{-Λ}; the layer then returns ā itself
    p_zero = torch.exp(-lam)
    fallback = ((draws - abar).abs().amax(-1) < 1e-12).double().mean(0)
    assert torch.all((fallback - p_zero).abs() <= 4 * torch.sqrt(p_zero * (1 - p_zero) / DRAWS) + 1 / DRAWS)

    # Theorem 1: E[a] = ā, per coordinate within 4 standard errors
    se = draws.std(0) / math.sqrt(DRAWS)
    assert torch.all((draws.mean(0) - abar).abs() <= 4 * se + 1e-12)

    # Theorem 2: E‖a − ā‖² = trΣ_V φ(Λ)
    sq = (draws - abar).square().sum(-1)  # [K, m]
    assert torch.all((sq.mean(0) - predicted).abs() <= 4 * sq.std(0) / math.sqrt(DRAWS))

    # and the full covariance: Cov(a) = φ(Λ) Σ_V, Σ_V = Σ_l p_l (V_l − ā)(V_l − ā)ᵀ, entrywise within
    # 5 standard errors (5, not 4: there are 8 × 8 entries per query)
    ref = reference_cell_form(layer, *inputs)
    p = ref["rates"][0, 0] / ref["evidence"][0, 0][:, None]
    centred = ref["field"][0, 0][None] - ref["abar"][0, 0][:, None]  # [m, L, d]
    expected = np.einsum("ml,mld,mle->mde", p, centred, centred) * levy_phi(lam).detach().numpy()[:, None, None]
    dev = (draws - abar).numpy()
    products = dev[..., :, None] * dev[..., None, :]  # [K, m, d, d]
    se_cov = products.std(0) / math.sqrt(DRAWS)
    assert np.all(np.abs(products.mean(0) - expected) <= 5 * se_cov)


def test_k_draw_spread_matches_deviation():
    layer, inputs = monte_carlo_setup(50.0)
    out = layer(*inputs)
    draws = layer.sample(*inputs, draws=DRAWS, generator=torch.Generator().manual_seed(3))[:, 0]
    sq = (draws - out.output[0].detach()).square().sum(-1)
    spread = sq.mean(0).sqrt()
    se = 0.5 * sq.std(0) / (sq.mean(0) * math.sqrt(DRAWS))  # relative s.e. of a root-mean-square
    assert torch.all((spread / out.deviation[0] - 1).abs() <= 4 * se)


def test_independent_heads_add_their_variances():
    """Four heads sampling independently: E‖a − ā‖² = Σ_h trΣ_h φ(Λ_h) (docs/levy.md#heads)."""
    layer, inputs = monte_carlo_setup(5.0, heads=4, head_dim=4)
    out = layer(*inputs)
    draws = layer.sample(*inputs, draws=DRAWS, generator=torch.Generator().manual_seed(11))[:, 0]
    sq = (draws - out.output[0].detach()).square().sum(-1)
    predicted = (out.disagreement_heads[0] * levy_phi(out.evidence_heads[0])).sum(-1)
    assert torch.all((sq.mean(0) - predicted).abs() <= 4 * sq.std(0) / math.sqrt(DRAWS))


def test_straight_through_samples_carry_the_mean_path_gradient():
    layer = make_layer(heads=2, head_dim=4)
    q, x, t, e = make_inputs(layer)
    sampled = layer.sample(q, x, t, e, draws=5, generator=torch.Generator().manual_seed(0), straight_through=True)
    plain = layer.sample(q, x, t, e, draws=5, generator=torch.Generator().manual_seed(0))
    assert sampled.requires_grad and not plain.requires_grad
    assert torch.allclose(sampled, plain, rtol=1e-13, atol=1e-14)  # the values are the draws
    # W_O is applied to the drawn value, so its weight gradient differs; every other parameter
    # sits before the straight-through and gets exactly the mean path's gradient
    params = [p for name, p in layer.named_parameters() if name not in ("out_proj.weight", "neutral_token", "neutral_identity")]
    grads_st = torch.autograd.grad(sampled.sum(), params)
    grads_mean = torch.autograd.grad(5 * layer(q, x, t, e).output.sum(), params)
    for a, b in zip(grads_st, grads_mean):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- masking, neutral token, gradients


def test_padded_keys_have_no_effect():
    layer = make_layer(heads=2, head_dim=4)
    q, x, t, e = make_inputs(layer, keys=12, per_sample_identity=True)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, [2, 5, 6, 11]] = False
    t_padded = t.clone()
    t_padded[0, [2, 5, 6, 11]] = torch.tensor([float("nan"), -3.0, 7.0, float("inf")], dtype=torch.float64)
    padded = layer(q, x, t_padded, e, mask)
    keep = mask[0]
    dropped = layer(q, x[:, keep], t[:, keep], e[:, keep])
    for field in ("output", "evidence", "disagreement", "deviation"):
        assert torch.allclose(getattr(padded, field), getattr(dropped, field), rtol=1e-12, atol=1e-14), field


def test_neutral_token_for_empty_history():
    layer = make_layer(heads=2, head_dim=4)
    q, x, t, e = make_inputs(layer, batch=3, keys=10)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1] = False
    out = layer(q, x, t, e, mask)
    assert out.empty_history.tolist() == [False, True, False]
    for field in ("output", "evidence", "disagreement", "deviation"):
        assert torch.isfinite(getattr(out, field)).all()
    assert torch.all(out.evidence[1] < out.evidence[0])  # one token's worth of evidence
    alone = layer(q[[0, 2]], x[[0, 2]], t[[0, 2]], e)
    assert torch.allclose(out.output[[0, 2]], alone.output, rtol=1e-12, atol=1e-14)
    (grad,) = torch.autograd.grad(out.output[1].sum(), layer.neutral_token)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    # no keys at all
    none = layer(q, x[:, :0], t[:, :0], e[:0])
    assert none.empty_history.all() and torch.isfinite(none.output).all()


def test_gradients_reach_every_parameter_including_the_channel_map():
    layer = make_layer(heads=4, head_dim=8, identity_dim=6, dtype=torch.float32)
    q, x, t, e = make_inputs(layer, batch=3, keys=40, queries=4)
    mask = torch.rand(3, 40, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[2] = False  # one empty sample, so that the neutral token is used too
    out = layer(q, x, t, e, mask)
    loss = out.output.square().mean() + out.evidence.log().mean() + out.disagreement.mean() + out.deviation.mean()
    loss.backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_gradcheck_through_positions_and_values():
    layer = make_layer(heads=2, head_dim=4, identity_dim=3, grid=(4, 4), eps=(0.25, 0.25))
    q, x, t, e = make_inputs(layer, keys=6, queries=2, per_sample_identity=True)
    t = 0.1 + 0.8 * t  # away from the [0, 1] check under the finite-difference steps

    def fn(queries, tokens, times, identity):
        out = layer(queries, tokens, times, identity)
        return torch.cat([out.output.flatten(), out.evidence.flatten(), out.disagreement.flatten(), out.deviation.flatten()])

    inputs = tuple(a.detach().requires_grad_() for a in (q, x, t, e))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


def test_gradcheck_with_identities_shared_by_the_batch():
    """[n, D] identities: u and its cell masses are computed once and broadcast over the batch."""
    layer = make_layer(heads=2, head_dim=4, identity_dim=3, grid=(4, 4), eps=(0.25, 0.25))
    q, x, t, e = make_inputs(layer, batch=2, keys=6, queries=2)
    t = 0.1 + 0.8 * t
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 2] = False

    def fn(queries, tokens, times, identity):
        out = layer(queries, tokens, times, identity, mask)
        return torch.cat([out.output.flatten(), out.evidence.flatten(), out.disagreement.flatten()])

    inputs = tuple(a.detach().requires_grad_() for a in (q, x, t, e))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)
    # same values and parameter gradients as the same identities given per sample
    shared, per_sample = layer(q, x, t, e, mask), layer(q, x, t, e.expand(2, -1, -1), mask)
    params = [p for name, p in layer.named_parameters() if not name.startswith("neutral")]  # no empty sample here
    grads = [torch.autograd.grad(o.output.sum() + o.evidence.sum(), params) for o in (shared, per_sample)]
    assert torch.allclose(shared.output, per_sample.output, rtol=1e-13, atol=1e-15)
    for g_shared, g_per_sample in zip(*grads):
        assert torch.allclose(g_shared, g_per_sample, rtol=1e-12, atol=1e-14)


def test_unit_vectors_match_normalize_and_its_gradient():
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(levy_module._UnitVectors.apply, (x,))
    x = x.detach()
    x[0, 1] = 1e-14  # the norm is floored here, as in F.normalize (finite differences would cross the floor)
    x.requires_grad_()
    grad = torch.randn_like(x)
    (ours,) = torch.autograd.grad(levy_module._UnitVectors.apply(x), x, grad)
    (ref,) = torch.autograd.grad(torch.nn.functional.normalize(x, dim=-1), x, grad)
    assert torch.equal(levy_module._UnitVectors.apply(x), torch.nn.functional.normalize(x, dim=-1))
    assert torch.allclose(ours, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("chunk", [1, 1 << 18])
def test_cell_average_matches_the_plain_product(monkeypatch, chunk):
    """_CellAverage (chunked, k-major inside) against _kron_rows(a, b) @ x: values and gradients."""
    monkeypatch.setattr(levy_module, "_CELL_CHUNK", chunk)  # 1: one sample per chunk
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 5, 4, generator=g, dtype=torch.float64)
    b = torch.rand(3, 2, 5, 3, generator=g, dtype=torch.float64)
    x = torch.randn(3, 2, 12, 6, generator=g, dtype=torch.float64)
    inputs = tuple(t.requires_grad_() for t in (a, b, x))
    assert torch.autograd.gradcheck(levy_module._CellAverage.apply, inputs)
    out, ref = levy_module._CellAverage.apply(*inputs), levy_module._kron_rows(a, b) @ x
    assert torch.allclose(out, ref, rtol=1e-14, atol=1e-15)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for ours, plain in zip(torch.autograd.grad(out, inputs, weights), torch.autograd.grad(ref, inputs, weights)):
        assert torch.allclose(ours, plain, rtol=1e-13, atol=1e-14)
    # b shared by the batch (broadcast view, as for identities given once): gradient summed over it
    shared = b[:1].detach().requires_grad_()
    (grad_shared,) = torch.autograd.grad(levy_module._CellAverage.apply(a, shared.expand(3, -1, -1, -1), x), shared, weights)
    (grad_plain,) = torch.autograd.grad(levy_module._kron_rows(a, shared.expand(3, -1, -1, -1)) @ x, shared, weights)
    assert torch.allclose(grad_shared, grad_plain, rtol=1e-13, atol=1e-14)


def test_query_chunks_do_not_change_the_result():
    layer = make_layer(heads=2, head_dim=4)
    q, x, t, e = make_inputs(layer, queries=5)
    whole, chunked = layer(q, x, t, e), with_config(layer, query_chunk=2)(q, x, t, e)
    for field in ("output", "evidence", "disagreement", "deviation"):
        assert torch.allclose(getattr(whole, field), getattr(chunked, field), rtol=1e-13, atol=1e-15)
    assert with_config(layer, query_chunk=2).sample(q, x, t, e, draws=3).shape == (3, 1, 5, 8)


def test_output_shapes():
    layer = make_layer(heads=4, head_dim=8, identity_dim=5, dtype=torch.float32)
    q, x, t, e = make_inputs(layer, batch=2, keys=7, queries=3)
    out = layer(q, x, t, e)
    assert out.output.shape == (2, 3, 32)
    assert out.evidence.shape == out.disagreement.shape == out.deviation.shape == (2, 3)
    assert out.evidence_heads.shape == (2, 3, 4) and out.empty_history.shape == (2,)
    assert layer.sample(q, x, t, e, draws=4).shape == (4, 2, 3, 32)
    assert layer.cell_intensity(q, x, t, e).shape == (2, 4, 3, 128)
    extra = sum(
        p.numel() for name, p in layer.named_parameters() if not name.startswith(("q_proj", "k_proj", "v_proj", "out_proj"))
    )
    assert extra == 4 * (5 + 1) + 32 + 5  # chan, neutral token, neutral identity


def test_input_errors_name_the_argument():
    layer = make_layer(heads=2, head_dim=4, dtype=torch.float32)
    q, x, t, e = make_inputs(layer, keys=5)
    cases = {
        "queries": (q[0], x, t, e, None),
        "tokens": (q, x[..., :3], t, e, None),
        "times": (q, x, t[0], e, None),
        "identity": (q, x, t, e[:, :2], None),
        "mask": (q, x, t, e, torch.ones(1, 5)),
    }
    for name, args in cases.items():
        with pytest.raises(ValueError, match=name):
            layer(*args)
    bad_times = t.clone()
    bad_times[0, 1] = 1.5
    with pytest.raises(ValueError, match="times"):
        layer(q, x, bad_times, e)
    with pytest.raises(ValueError, match="draws"):
        layer.sample(q, x, t, e, draws=0)
    for bad in (
        {"embed_dim": 10, "num_heads": 4},
        {"beta": 0.0},
        {"tau": -1.0},
        {"grid": (0, 8)},
        {"eps": (0.1, 0.0)},
        {"embed_dim": 8, "num_heads": 4},
    ):
        with pytest.raises(ValueError):
            LevyAttentionConfig(**bad)


# --------------------------------------------------------------------------- per-action head


def test_action_head_gives_each_action_its_own_signals():
    torch.manual_seed(0)
    head = LevyActionHead(
        LevyActionHeadConfig(
            attention=LevyAttentionConfig(embed_dim=32, num_heads=4, identity_dim=6), num_actions=2, hidden_dim=16
        )
    )
    x, t, e = torch.randn(3, 20, 32), torch.rand(3, 20), torch.randn(20, 6)
    out = head(x, t, e)
    assert out.action.shape == (3, 2)
    assert out.attention.deviation.shape == (3, 2)
    assert not torch.allclose(out.attention.evidence[:, 0], out.attention.evidence[:, 1])
    out.action.sum().backward()
    for name, p in head.named_parameters():
        if "neutral" not in name:  # the neutral token is used only for empty histories
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert head.action_embedding.grad.abs().sum() > 0
    samples = head.sample(x, t, e, draws=6, generator=torch.Generator().manual_seed(0))
    assert samples.shape == (6, 3, 2) and torch.isfinite(samples).all()


def test_fourier_time_features():
    features = fourier_time_features(torch.tensor([0.0, 0.5, 1.0]), 8)
    assert features.shape == (3, 8)
    assert torch.allclose(features[0], torch.tensor([0.0] * 4 + [1.0] * 4))
    with pytest.raises(ValueError, match="even"):
        fourier_time_features(torch.tensor([0.0]), 7)


# --------------------------------------------------------------------------- calibration


def calibration_data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sigma = torch.exp(0.5 * torch.randn(n, generator=g, dtype=torch.float64))
    mu = torch.randn(n, generator=g, dtype=torch.float64)
    z = torch.randn(n, generator=g, dtype=torch.float64)
    return mu, sigma, z


def test_affine_calibration_recovers_a_known_scale():
    mu, sigma, z = calibration_data(5000)
    a, b = fit_affine_scale(mu, sigma, mu + 2.5 * sigma * z)
    assert a.shape == () and a.item() == pytest.approx(2.5, rel=0.15)
    assert b.item() <= 0.15 * (2.5 * sigma * z).std().item()
    a, b = fit_affine_scale(
        mu, sigma, mu + (1.0 * sigma + 0.5) * z, a_grid=torch.linspace(0, 2, 41), b_grid=torch.linspace(0, 1, 41)
    )
    assert a.item() == pytest.approx(1.0, abs=0.15) and b.item() == pytest.approx(0.5, abs=0.1)


def test_affine_calibration_per_action_and_uninformative_signal():
    mu, sigma, z = calibration_data(2000)
    y = torch.stack([mu + 0.3 * sigma * z, mu + 1.0 * z], dim=1)
    a, b = fit_affine_scale(torch.stack([mu, mu], 1), torch.stack([sigma, sigma.flip(0)], 1), y)
    assert a.shape == (2,)
    assert a[0].item() == pytest.approx(0.3, rel=0.15)
    assert a[1].item() < 0.1 * (y[:, 1].std() / sigma.mean()).item()  # σ̂ says nothing about action 1
    assert b[1].item() == pytest.approx(1.0, rel=0.15)


def test_affine_calibration_skips_zero_scales():
    mu, sigma, z = calibration_data(500)
    sigma[:10] = 0.0  # trΣ_V = 0 samples: a·0 + 0 would be a zero scale
    a, b = fit_affine_scale(mu, sigma, mu + z, b_grid=[0.0, 0.5, 1.0])
    assert b.item() > 0
    with pytest.raises(ValueError, match="positive scale"):
        fit_affine_scale(mu, sigma, mu + z, b_grid=[0.0])


def test_calibration_input_errors():
    mu, sigma, z = calibration_data(50)
    with pytest.raises(ValueError, match="share a shape"):
        fit_affine_scale(mu, sigma[:-1], mu)
    with pytest.raises(ValueError, match="sigma_hat"):
        fit_affine_scale(mu, -sigma, mu)
    with pytest.raises(ValueError, match="a_grid"):
        fit_affine_scale(mu, sigma, mu, a_grid=[-1.0, 1.0])
    with pytest.raises(ValueError, match="alpha"):
        conformal_quantile([1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="alpha"):
        gaussian_interval(mu, sigma, 0.0)
    with pytest.raises(ValueError, match="scores"):
        conformal_quantile([], 0.1)
    with pytest.raises(ValueError, match="scale"):
        conformal_scores(mu, mu, torch.zeros_like(mu))
    with pytest.raises(ValueError, match="share a shape"):
        conformal_scores(mu, mu[:3], sigma)


def test_conformal_quantile_rank_rule():
    scores = [0.4, 0.1, 0.3, 0.2]
    assert conformal_quantile(scores, 0.5).item() == 0.3  # ⌈5·0.5⌉ = 3rd smallest
    assert conformal_quantile(scores, 0.2).item() == 0.4  # ⌈5·0.8⌉ = 4th
    assert math.isinf(conformal_quantile(scores, 0.1).item())  # ⌈4.5⌉ = 5 > n
    assert conformal_quantile(torch.arange(1.0, 100.0), 0.1).item() == 90.0  # 100·0.9 is exactly rank 90
    two = conformal_quantile(torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]), 0.5)
    assert two.tolist() == [3.0, 30.0]
    low, high = conformal_interval(torch.tensor([1.0]), torch.tensor([2.0]), 0.5)
    assert low.item() == 0.0 and high.item() == 2.0


def test_conformal_coverage_on_exchangeable_data():
    trials, n_cal, n_test, alpha = 400, 99, 100, 0.1
    g = torch.Generator().manual_seed(5)
    scale = torch.exp(0.5 * torch.randn(trials, n_cal + n_test, generator=g, dtype=torch.float64))
    # the scale is mis-specified (true sd = s·(1 + U/2)): conformal coverage does not care
    noise = 1 + 0.5 * torch.rand(trials, n_cal + n_test, generator=g, dtype=torch.float64)
    y = scale * noise * torch.randn(trials, n_cal + n_test, generator=g, dtype=torch.float64)
    mu = torch.zeros_like(y)
    scores = conformal_scores(y[:, :n_cal].T, mu[:, :n_cal].T, scale[:, :n_cal].T)  # [n_cal, trials]
    q_hat = conformal_quantile(scores, alpha)  # [trials]
    low, high = conformal_interval(mu[:, n_cal:], scale[:, n_cal:], q_hat[:, None])
    covered = ((y[:, n_cal:] >= low) & (y[:, n_cal:] <= high)).double().mean(1)  # per trial
    se = covered.std() / math.sqrt(trials)
    # exchangeable: 1 − α ≤ coverage < 1 − α + 1/(n+1); here (n+1)(1−α) = 90 exactly, so coverage = 0.9
    assert abs(covered.mean().item() - 0.9) <= 4 * se.item()
    # the Gaussian interval with the true scale covers ~1 − α too (sanity of z_{1−α/2})
    low_g, high_g = gaussian_interval(torch.zeros(20_000), torch.ones(20_000), 0.1)
    z = torch.randn(20_000, generator=g, dtype=torch.float64)
    assert abs(((z >= low_g) & (z <= high_g)).double().mean().item() - 0.9) <= 4 * math.sqrt(0.09 / 20_000)


def test_log_sigma_read_outs_are_floored_smoothly_so_they_always_have_a_gradient():
    """A read-out driven far below the floor stays at σ ≥ e^-4 and still gets a gradient back
    (a hard clamp gave none, and its NLL term grew as e^20·r²)."""
    from nsacdrive.controllers.heads import LOG_SIGMA_FLOOR, smooth_floor

    raw = torch.tensor([-30.0, -4.0, 0.0, 3.0], requires_grad=True)
    floored = smooth_floor(raw, LOG_SIGMA_FLOOR)
    assert bool((floored >= LOG_SIGMA_FLOOR).all()) and bool((floored[1:] > LOG_SIGMA_FLOOR).all())
    torch.testing.assert_close(floored[-1], raw[-1], atol=1e-3, rtol=0)  # ≈ identity well above the floor
    floored.sum().backward()
    assert bool((raw.grad > 0).all())


@pytest.mark.parametrize("sharpness", [1.0, 4.0])
def test_the_model_config_sets_the_kernel_sharpness_and_evidence_stays_in_its_bounds(sharpness):
    from nsacdrive.controllers.model_config import ModelConfig
    from nsacdrive.controllers.registry import build_controller
    torch.manual_seed(0)
    head = build_controller(ModelConfig(model="levy", levy_sharpness=sharpness)).head
    assert head.actions.attention.config.beta == sharpness
    tokens = torch.randn(8, 4, head.log_sigma_weight.shape[1])
    times = 1.0 + torch.tensor([-0.12, -0.08, -0.04, 0.0]).expand(8, 4)
    evidence = head.signals(tokens, times)["evidence"]
    # Λ = τ Σ_i exp(β cos(q, k_i)) over n = 4 keys, τ = 1 (docs/levy.md#kernel)
    assert torch.all((evidence >= 4 * math.exp(-sharpness) * (1 - 1e-5)) & (evidence <= 4 * math.exp(sharpness) * (1 + 1e-5)))
