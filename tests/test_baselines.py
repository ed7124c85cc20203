"""Baselines (controllers/baselines.py): MC-Dropout, Deep Ensemble, Deep Evidential Regression, SDE-Net."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from nsacdrive.controllers.actions import ACTION_HIGH, ACTION_LOW
from nsacdrive.controllers.baselines import (
    EnsembleController,
    EvidentialHead,
    MCDropoutHead,
    SDENetHead,
    forced_dropout,
    nig_nll,
    nig_regulariser,
)
from nsacdrive.controllers.controller import Controller, head_times
from nsacdrive.controllers.encoders import EncoderConfig, make_encoder
from nsacdrive.controllers.heads import GMLEHead
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.model_names import MODEL_NAMES
from nsacdrive.controllers.objectives import gaussian_nll
from nsacdrive.controllers.registry import MODEL_BUILDERS, build_controller

HEADS = ["mcdropout", "evidential", "sdenet"]
HEAD_TYPES = {"mcdropout": MCDropoutHead, "evidential": EvidentialHead, "sdenet": SDENetHead}
B, T, F_TOKEN = 4, 5, 16


def config(**kw) -> ModelConfig:
    defaults = dict(d_model=16, num_heads=4, topk=4, encoder=EncoderConfig(token_dim=F_TOKEN, channels=(8, 8, 8)))
    return ModelConfig(**{**defaults, **kw})


def make_head(name: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return MODEL_BUILDERS[name](config(model=name, **kw))


def tokens(batch: int = B, length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, length, F_TOKEN, generator=torch.Generator().manual_seed(seed))


def times(batch: int = B, length: int = T) -> torch.Tensor:
    return head_times(-0.02 * torch.arange(length - 1, -1, -1.0)).expand(batch, length)


def targets(batch: int = B, seed: int = 2) -> torch.Tensor:
    u = torch.rand(batch, 3, generator=torch.Generator().manual_seed(seed))
    return ACTION_LOW + (ACTION_HIGH - ACTION_LOW) * (0.1 + 0.8 * u)


def perturbed(x: torch.Tensor, std: float = 3.0, seed: int = 9) -> torch.Tensor:
    return x + std * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))


def loss_of(head, x, y, **kw) -> dict[str, torch.Tensor]:
    return head.training_loss(x, times(x.shape[0], x.shape[1]), y, perturbed(x) if head.uses_perturbed_inputs else None, **kw)


def assert_valid_prediction(pred, batch: int = B) -> None:
    for value in (pred.mean, pred.aleatoric, pred.epistemic):
        assert value.shape == (batch, 3)
        assert torch.isfinite(value).all()
    assert (pred.mean >= ACTION_LOW).all() and (pred.mean <= ACTION_HIGH).all()
    assert (pred.aleatoric >= 0).all() and (pred.epistemic >= 0).all()


# ------------------------------------------------------------------------------ every head


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("train_mode", [True, False])
def test_prediction_shapes_box_and_variances(name, train_mode):
    head = make_head(name).train(train_mode)
    assert isinstance(head, HEAD_TYPES[name])
    with torch.no_grad():
        pred = head.predict(tokens(), times(), samples=8)
    assert_valid_prediction(pred)


@pytest.mark.parametrize("name", HEADS)
def test_all_parameters_get_finite_gradients(name):
    head = make_head(name)
    terms = loss_of(head, tokens(), targets())
    assert terms["total"].dim() == 0 and torch.isfinite(terms["total"])
    terms["total"].backward()
    for pname, p in head.named_parameters():
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"
    assert any(p.grad.abs().sum() > 0 for p in head.parameters())


@pytest.mark.parametrize("name", HEADS)
def test_deterministic_under_a_fixed_seed(name):
    def run():
        head = make_head(name, seed=3)
        torch.manual_seed(4)
        loss = loss_of(head, tokens(), targets())["total"]
        with torch.no_grad():
            pred = head.predict(tokens(), times(), samples=6)
        return loss.detach(), pred

    (loss_a, a), (loss_b, b) = run(), run()
    assert torch.equal(loss_a, loss_b)
    for x, y in ((a.mean, b.mean), (a.aleatoric, b.aleatoric), (a.epistemic, b.epistemic)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", HEADS)
def test_tiny_overfit_lowers_the_loss(name):
    head = make_head(name)
    x, y = tokens(batch=16, seed=11), targets(batch=16, seed=12)

    def evaluation_loss() -> float:
        head.eval()  # MC-Dropout: deterministic; SDE-Net: same noise before and after
        torch.manual_seed(0)
        with torch.no_grad():
            value = loss_of(head, x, y)["total"].item()
        head.train()
        return value

    before = evaluation_loss()
    optimiser = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(60):
        optimiser.zero_grad()
        loss_of(head, x, y)["total"].backward()
        optimiser.step()
    after = evaluation_loss()
    assert after < before - 0.5, (before, after)


@pytest.mark.parametrize("name", HEADS)
def test_targets_shaped_b_raise(name):
    head = make_head(name)
    with pytest.raises(ValueError, match=r"\[B, out\]"):
        loss_of(head, tokens(), targets()[:, 0])


@pytest.mark.parametrize("name", HEADS)
def test_registry_builds_a_controller_that_trains_and_predicts(name):
    torch.manual_seed(0)
    controller = build_controller(config(model=name))
    assert isinstance(controller, Controller) and isinstance(controller.head, HEAD_TYPES[name])
    frames = torch.rand(2, 3, 3, 84, 96, generator=torch.Generator().manual_seed(0))
    timestamps = -0.02 * torch.arange(2, -1, -1.0).expand(2, 3)
    terms = controller.training_loss(frames, timestamps, targets(2), perturb=lambda f: f + 0.2 * torch.randn_like(f))
    terms["total"].backward()
    controller.eval()
    assert_valid_prediction(controller.predict(frames, timestamps, samples=4), batch=2)


def test_every_model_name_the_config_accepts_has_a_builder():
    assert sorted(MODEL_BUILDERS) == sorted(MODEL_NAMES)
    with pytest.raises(ValueError, match="unknown model 'transformer'"):
        ModelConfig(model="transformer")


# ------------------------------------------------------------------------------ MC-Dropout


def test_mcdropout_has_real_dropout_on_attention_and_features():
    head = make_head("mcdropout", dropout=0.2)
    assert head.nac.config.dropout == 0.2
    assert head.nac.core.attention_dropout.p == 0.2 and head.feature_dropout.p == 0.2


def test_mcdropout_epistemic_positive_in_eval_mode_and_dropout_modes_restored():
    head = make_head("mcdropout").eval()
    with torch.no_grad():
        pred = head.predict(tokens(), times(), samples=16)
    assert (pred.epistemic > 0).all()
    assert not any(m.training for m in head.modules())  # forced dropout did not leak out of predict
    with forced_dropout(head):
        assert head.feature_dropout.training and head.nac.core.attention_dropout.training
        assert not head.gaussian.training
    assert not head.feature_dropout.training


def test_mcdropout_without_dropout_has_zero_epistemic():
    head = make_head("mcdropout", dropout=0.0)
    with torch.no_grad():
        pred = head.predict(tokens(), times(), samples=10)
    torch.testing.assert_close(pred.epistemic, torch.zeros(B, 3), atol=1e-10, rtol=0)


def test_mcdropout_samples_are_one_batched_pass_of_the_head():
    head = make_head("mcdropout").eval()
    calls = []
    head.nac.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    with torch.no_grad():
        head.predict(tokens(), times(), samples=7)
    assert calls == [7 * B]


def test_mcdropout_moments_are_those_of_the_squashed_draws():
    head = make_head("mcdropout").eval()
    torch.manual_seed(5)
    with torch.no_grad():
        pred = head.predict(tokens(), times(), samples=9)
    torch.manual_seed(5)
    with torch.no_grad(), forced_dropout(head):
        mean, log_sigma = head.draws(tokens(), times(), 9)
    torch.testing.assert_close(pred.mean, mean.mean(0))
    torch.testing.assert_close(pred.epistemic, mean.var(0, unbiased=False))
    torch.testing.assert_close(pred.aleatoric, torch.exp(2 * log_sigma).mean(0))  # e^{2 log σ}, not softplus


def test_mcdropout_training_loss_is_the_mean_nll_over_masks():
    head = make_head("mcdropout", train_samples=3)
    torch.manual_seed(6)
    loss = loss_of(head, tokens(), targets())["total"]
    torch.manual_seed(6)
    mean, log_sigma = head.draws(tokens(), times(), 3)
    expected = torch.stack([gaussian_nll(mean[s], log_sigma[s], targets()) for s in range(3)]).mean()
    torch.testing.assert_close(loss, expected)


# ------------------------------------------------------------------------------ Deep Ensemble


def tiny_frames(batch: int = 2, length: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    frames = torch.rand(batch, length, 3, 84, 96, generator=torch.Generator().manual_seed(seed))
    return frames, (-0.02 * torch.arange(length - 1, -1, -1.0)).expand(batch, length)


def make_ensemble(seed: int = 0, members: int = 3, **kw) -> EnsembleController:
    torch.manual_seed(seed)
    model = build_controller(config(model="ensemble", members=members))
    assert isinstance(model, EnsembleController)
    return model


def test_ensemble_is_not_a_head():
    with pytest.raises(ValueError, match="build_controller"):
        MODEL_BUILDERS["ensemble"](config(model="ensemble"))
    with pytest.raises(ValueError, match="members >= 2"):
        EnsembleController(config(model="ensemble", members=1))


def test_ensemble_members_are_whole_controllers_with_different_inits():
    model = make_ensemble()
    assert len(model.members) == 3
    assert all(isinstance(m, Controller) and isinstance(m.head, GMLEHead) for m in model.members)
    first, second = (dict(m.named_parameters()) for m in model.members[:2])
    random_init = [name for name, p in first.items() if p.unique().numel() > 1]  # not the constant GroupNorm/bias inits
    assert len(random_init) > 10
    assert all(not torch.equal(first[name], second[name]) for name in random_init)
    # member k is exactly the controller built after torch.manual_seed(base_seed + k)
    torch.manual_seed(model.base_seed + 2)
    cfg = config(model="ensemble")
    reference = Controller(make_encoder(cfg.encoder), GMLEHead(cfg.nac_config()))
    for (name, a), b in zip(model.members[2].named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_ensemble_is_reproducible_from_the_global_seed():
    a, b, c = make_ensemble(seed=0), make_ensemble(seed=0), make_ensemble(seed=1)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert a.base_seed != c.base_seed
    frames, timestamps = tiny_frames()
    pa, pb = a.predict(frames, timestamps), b.predict(frames, timestamps)
    assert torch.equal(pa.mean, pb.mean) and torch.equal(pa.epistemic, pb.epistemic)


def test_ensemble_mixture_moments_equal_hand_computed():
    model = make_ensemble().eval()
    frames, timestamps = tiny_frames()
    pred = model.predict(frames, timestamps, samples=5)
    assert_valid_prediction(pred, batch=2)
    assert (pred.epistemic > 0).all()
    members = [m.predict(frames, timestamps) for m in model.members]
    mu = torch.stack([p.mean for p in members])
    var = torch.stack([p.aleatoric for p in members])
    mixture_mean = sum(members[k].mean for k in range(3)) / 3
    torch.testing.assert_close(pred.mean, mixture_mean)
    torch.testing.assert_close(pred.aleatoric, sum(members[k].aleatoric for k in range(3)) / 3)
    torch.testing.assert_close(pred.epistemic, sum((mu[k] - mixture_mean) ** 2 for k in range(3)) / 3)
    # law of total variance of the mixture: E[y²] − E[y]² = avg(σ² + μ²) − mean²
    torch.testing.assert_close(pred.total, (var + mu**2).mean(0) - pred.mean**2, atol=1e-6, rtol=1e-5)


def test_ensemble_loss_is_the_sum_and_members_are_independent():
    model = make_ensemble()
    frames, timestamps = tiny_frames()
    y = targets(2)
    terms = model.training_loss(frames, timestamps, y)
    members = [model.member_loss(k, frames, timestamps, y)["total"] for k in range(3)]
    torch.testing.assert_close(terms["total"], sum(members))
    torch.testing.assert_close(terms["member1"], members[1].detach())
    members[0].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.members[0].parameters())
    assert all(p.grad is None for k in (1, 2) for p in model.members[k].parameters())


def test_ensemble_targets_shaped_b_raise():
    model = make_ensemble(members=2)
    frames, timestamps = tiny_frames()
    with pytest.raises(ValueError, match=r"\[B, out\]"):
        model.training_loss(frames, timestamps, targets(2)[:, 0])


def test_ensemble_tiny_overfit_lowers_the_loss():
    model = make_ensemble(members=2)
    frames, timestamps = tiny_frames(batch=4, seed=3)
    y = targets(4, seed=4)
    before = model.training_loss(frames, timestamps, y)["total"].item()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        optimiser.zero_grad()
        model.training_loss(frames, timestamps, y)["total"].backward()
        optimiser.step()
    after = model.training_loss(frames, timestamps, y)["total"].item()
    assert after < before - 0.5, (before, after)


# ------------------------------------------------------------------------------ Deep Evidential Regression


def test_nig_nll_is_the_student_t_marginal():
    g = torch.Generator().manual_seed(0)
    shape = (50,)
    y = torch.randn(shape, generator=g, dtype=torch.float64)
    gamma = torch.randn(shape, generator=g, dtype=torch.float64)
    nu = torch.rand(shape, generator=g, dtype=torch.float64) * 5 + 0.01
    alpha = torch.rand(shape, generator=g, dtype=torch.float64) * 5 + 1.01
    beta = torch.rand(shape, generator=g, dtype=torch.float64) * 3 + 0.01
    ours = nig_nll(y, gamma, nu, alpha, beta)
    scale = torch.sqrt(beta * (1 + nu) / (nu * alpha))
    reference = -stats.t.logpdf(y.numpy(), df=2 * alpha.numpy(), loc=gamma.numpy(), scale=scale.numpy())
    torch.testing.assert_close(ours, torch.from_numpy(reference), rtol=1e-10, atol=1e-10)
    # one value by hand: y = γ, ν = 1, α = 1, β = 1 → Ω = 4
    hand = 0.5 * math.log(math.pi) - math.log(4) + 1.5 * math.log(4) + math.lgamma(1.0) - math.lgamma(1.5)
    one = torch.ones(1, dtype=torch.float64)
    assert nig_nll(0 * one, 0 * one, one, one, one).item() == pytest.approx(hand, rel=1e-12)


def test_evidential_loss_and_prediction_formulas():
    head = make_head("evidential", evidential_coeff=0.3)
    assert head.coeff == 0.3
    x, y = tokens(), targets()
    gamma, nu, alpha, beta = head.nig(x, times())
    assert (nu > 0).all() and (alpha > 1).all() and (beta > 0).all()
    terms = head.training_loss(x, times(), y)
    expected = nig_nll(y, gamma, nu, alpha, beta).mean() + 0.3 * ((y - gamma).abs() * (2 * nu + alpha)).mean()
    torch.testing.assert_close(terms["total"], expected)
    torch.testing.assert_close(terms["regulariser"], nig_regulariser(y, gamma, nu, alpha).mean().detach())
    pred = head.predict(x, times(), samples=1)
    torch.testing.assert_close(pred.mean, gamma)
    torch.testing.assert_close(pred.aleatoric, beta / (alpha - 1))
    torch.testing.assert_close(pred.epistemic, beta / (nu * (alpha - 1)))
    # per sample, never a dataset-mean scalar
    assert not torch.allclose(pred.aleatoric, pred.aleatoric[:1].expand_as(pred.aleatoric))
    assert not torch.allclose(pred.epistemic, pred.epistemic[:1].expand_as(pred.epistemic))


def test_evidential_default_coefficient():
    assert ModelConfig().evidential_coeff == 0.01
    assert make_head("evidential").coeff == 0.01


# ------------------------------------------------------------------------------ SDE-Net


def test_sdenet_reads_the_whole_sequence():
    head = make_head("sdenet")
    x = tokens()
    y = x.clone()
    y[:, 0] += 3.0  # change only the OLDEST frame
    with torch.no_grad():
        assert not torch.allclose(head.encode(x, times()), head.encode(y, times()))


def test_sdenet_needs_perturbed_tokens():
    head = make_head("sdenet")
    with pytest.raises(ValueError, match="perturbed_tokens"):
        head.training_loss(tokens(), times(), targets())


def test_sdenet_terms_train_disjoint_parameters():
    head = make_head("sdenet")
    x, y = tokens(), targets()
    torch.manual_seed(3)
    total = head.training_loss(x, times(), y, perturbed(x))["total"]
    diffusion_params = list(head.diffusion_net.parameters())
    other_params = [p for n, p in head.named_parameters() if not n.startswith("diffusion_net.")]
    grads = torch.autograd.grad(total, diffusion_params + other_params)
    # the diffusion net learns from the separation BCE only ...
    h0, h0p = head.encode(x, times()).detach(), head.encode(perturbed(x), times()).detach()
    lc, lp = head.diffusion_logit(h0), head.diffusion_logit(h0p)
    bce = (torch.nn.functional.binary_cross_entropy_with_logits(lc, torch.zeros_like(lc))
           + torch.nn.functional.binary_cross_entropy_with_logits(lp, torch.ones_like(lp)))
    for got, want in zip(grads[: len(diffusion_params)], torch.autograd.grad(bce, diffusion_params), strict=True):
        torch.testing.assert_close(got, want)
    # ... and summary / drift / read-out from the NLL of one path with the diffusion value detached
    torch.manual_seed(3)
    h0 = head.encode(x, times())
    g = head.sigma_max * torch.sigmoid(head.diffusion_logit(h0)).detach()
    nll = gaussian_nll(*head.gaussian(head.integrate(h0, g)), y)
    for got, want in zip(grads[len(diffusion_params):], torch.autograd.grad(nll, other_params), strict=True):
        torch.testing.assert_close(got, want)


def test_sdenet_prediction_is_batched_and_zero_diffusion_gives_zero_epistemic():
    head = make_head("sdenet").eval()
    summaries, drifts = [], []
    head.summary.register_forward_hook(lambda module, args, out: summaries.append(args[0].shape))
    head.drift.register_forward_hook(lambda module, args, out: drifts.append(args[0].shape))
    with torch.no_grad():
        head.predict(tokens(), times(), samples=7)
    assert len(summaries) == 1 and summaries[0][0] == B
    assert drifts == [torch.Size([7, B, 16])] * head.depth
    still = make_head("sdenet", sde_sigma_max=0.0)
    with torch.no_grad():
        pred = still.predict(tokens(), times(), samples=10)
    torch.testing.assert_close(pred.epistemic, torch.zeros(B, 3), atol=1e-10, rtol=0)


def test_sdenet_diffusion_separates_perturbed_inputs_after_training():
    head = make_head("sdenet", sde_sigma_max=1.0)
    x, y = tokens(batch=16, seed=21), targets(batch=16, seed=22)
    xp = perturbed(x, std=3.0, seed=23)
    with torch.no_grad():
        clean0, pert0 = head.diffusion(x, times(16)).mean(), head.diffusion(xp, times(16)).mean()
    optimiser = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(40):
        optimiser.zero_grad()
        head.training_loss(x, times(16), y, xp)["total"].backward()
        optimiser.step()
    head.eval()
    with torch.no_grad():
        clean1, pert1 = head.diffusion(x, times(16)).mean(), head.diffusion(xp, times(16)).mean()
        assert pert1 > pert0 and clean1 < clean0
        assert pert1 > clean1 + 0.5 * head.sigma_max
        torch.manual_seed(0)
        clean_pred = head.predict(x, times(16), samples=32)
        perturbed_pred = head.predict(xp, times(16), samples=32)
    assert perturbed_pred.epistemic.mean() > 2 * clean_pred.epistemic.mean()
