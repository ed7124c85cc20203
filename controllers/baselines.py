"""Honest uncertainty baselines: MC-Dropout, Deep Ensemble, Deep Evidential Regression, SDE-Net.

The published baselines (docs/nsac.md#published-baselines) were not what their
names say: "MC-Dropout" had no dropout on CarRacing, the "Deep Ensemble" was weight jitter of ONE
model, GMLE/DER metrics were computed on dataset-mean scalars, and SDE-Net saw the last frame
only. Here every baseline is the method of its paper, behind the common head contract of
:mod:`nsacdrive.controllers.heads` (means squashed into the action box BEFORE moments are taken,
variances per sample and per action, in action units):

* :class:`MCDropoutHead` (Gal & Ghahramani 2016): NAC features with real attention dropout +
  feature dropout before a Gaussian read-out. Trained on the Gaussian NLL with dropout active;
  prediction runs S stochastic passes of the head with dropout forced on (also in ``eval()``),
  batched into one pass. Aleatoric = mean e^{2 log σ}, the parameterisation used in training
  (the published code used softplus at test time only).
* :class:`EnsembleController` (Lakshminarayanan et al. 2017): M independently initialised WHOLE
  controllers (encoder + GMLE head) combined as a uniform Gaussian mixture. It is a controller,
  not a head; :func:`nsacdrive.controllers.registry.build_controller` returns it for ``--model ensemble``.
* :class:`EvidentialHead` (Amini et al. 2020): a Normal-Inverse-Gamma per action, NIG NLL +
  evidence regulariser.
* :class:`SDENetHead` (Kong et al. 2020): a temporal summary of the SAME token sequence the other
  heads see, a neural SDE (drift + input-dependent diffusion) integrated by Euler–Maruyama, and a
  Gaussian read-out; the diffusion net is trained to separate clean from perturbed inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from nsacdrive.controllers.actions import squash
from nsacdrive.controllers.calibration import Calibration, calibrated
from nsacdrive.controllers.circuit_attention import validate_inputs
from nsacdrive.controllers.controller import Controller
from nsacdrive.controllers.density import FeatureDensity
from nsacdrive.controllers.encoders import make_encoder
from nsacdrive.controllers.heads import N_ACTIONS, GaussianHead, GMLEHead, UncertaintyHead
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.noise import randn_like_on
from nsacdrive.controllers.nsac import LOG_SIGMA_BOUNDS, NAC, NACConfig
from nsacdrive.controllers.objectives import check_targets, gaussian_nll
from nsacdrive.controllers.prediction import UncertainPrediction, decompose
from nsacdrive.controllers.robust_augment import Anchor


def _check_samples(samples: int) -> None:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")


def _repeat_batch(x: torch.Tensor, samples: int) -> torch.Tensor:
    """[B, ...] → [S·B, ...], sample-major (row s·B + b is x[b]), so outputs reshape to [S, B, ...]."""
    return x.repeat(samples, *([1] * (x.dim() - 1)))


# ----------------------------------------------------------------------------------- MC-Dropout


@contextmanager
def forced_dropout(module: nn.Module) -> Iterator[None]:
    """Switch every dropout layer of ``module`` to training behaviour, whatever ``module.training`` is.

    Only dropout layers change mode (nothing else in the module reads ``training`` differently),
    and their previous modes are restored afterwards.
    """
    layers = [m for m in module.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    saved = [m.training for m in layers]
    try:
        for m in layers:
            m.train(True)
        yield
    finally:
        for m, mode in zip(layers, saved, strict=True):
            m.train(mode)


class MCDropoutHead(UncertaintyHead):
    """NAC (attention dropout p) → Dropout(p) on the features → Gaussian read-out (squashed mean, log σ).

    Training: the dropout variational objective E_mask[NLL], estimated with ``train_samples``
    independent masks per sequence (the batch repeated S times, one pass; S = 1 is the classic
    one-mask-per-step training). Dropout follows ``module.training`` here, as usual.

    Prediction: S stochastic passes of the head only (the encoder tokens are given), dropout
    forced on even in ``eval()`` mode, batched as ONE pass over the batch repeated S times;
    epistemic = Var_s of the squashed means, aleatoric = mean_s e^{2 log σ_s} (log σ clamped to
    [−10, 5] exactly as in :func:`gaussian_nll`). With p = 0 the passes coincide and epistemic = 0.
    """

    stochastic_prediction = True

    def __init__(self, config: NACConfig, dropout: float, train_samples: int = 1, nll_beta: float = 0.0) -> None:
        super().__init__()
        self.nll_beta = nll_beta
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        if train_samples < 1:
            raise ValueError(f"train_samples must be >= 1, got {train_samples}")
        self.nac = NAC(config)
        self.feature_dropout = nn.Dropout(dropout)
        self.gaussian = GaussianHead(config.d_model)
        self.train_samples = train_samples

    def draws(self, tokens: torch.Tensor, times: torch.Tensor, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Squashed means and log σ of ``samples`` dropout draws, [S, B, 3], in one batched pass."""
        _check_samples(samples)
        batch = tokens.shape[0]
        features = self.nac(_repeat_batch(tokens, samples), _repeat_batch(times, samples))
        mean, log_sigma = self.gaussian(self.feature_dropout(features))
        return mean.view(samples, batch, N_ACTIONS), log_sigma.view(samples, batch, N_ACTIONS)

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        mean, log_sigma = self.draws(tokens, times, self.train_samples)
        check_targets(mean[0], target)
        return {"total": gaussian_nll(mean, log_sigma, target.expand_as(mean), self.nll_beta)}

    def predict(self, tokens, times, samples):
        with forced_dropout(self):
            mean, log_sigma = self.draws(tokens, times, samples)
        return decompose(mean, log_sigma.clamp(*LOG_SIGMA_BOUNDS))


# ------------------------------------------------------------------------------- Deep Ensemble


@dataclass(frozen=True)
class MemberView:
    """What one ensemble member trains on in a step: frames [B, T, C, H, W], their labels, and the
    consistency term's clean views (None: no term)."""

    frames: torch.Tensor
    target: torch.Tensor
    anchor: Anchor | None = None


class EnsembleController(nn.Module):
    """M independently initialised controllers (encoder + GMLE head) as a uniform Gaussian mixture.

    Member k is built right after ``torch.manual_seed(base_seed + k)`` inside a forked RNG, so the
    members differ only through their initialisation and the global RNG stream is left as if one
    integer (``base_seed``, drawn from it when not given) had been consumed: seeding the global
    RNG before :func:`build_controller` makes the whole ensemble reproducible, and different run
    seeds give different ensembles.

    Training: :meth:`training_loss` returns the SUM of the member losses on the SAME batch. The
    members share no parameter, so each member's gradient is exactly the gradient of its own
    loss, and with a per-parameter optimiser (Adam/AdamW, no global-norm clipping across members)
    one optimiser on the sum is M independent trainings. Members see the same data order; their
    independence comes from the random initialisation, which Lakshminarayanan et al. (2017) found
    sufficient (they also shuffle per member; :meth:`member_loss` lets a trainer do that).
    Caution: clipping the gradient norm over ALL parameters couples the members through the
    common clip factor; clip per member (:meth:`member_parameters`) if clipping is wanted.

    Prediction: member k gives (μ_k, σ²_k); the mixture moments are mean = avg μ_k,
    aleatoric = avg σ²_k, epistemic = Var_k μ_k (population variance), total = their sum.
    """

    uses_perturbed_inputs = False

    def __init__(self, config: ModelConfig, base_seed: int | None = None) -> None:
        super().__init__()
        if config.members < 2:
            raise ValueError(f"an ensemble needs members >= 2 (one member has no epistemic spread), got {config.members}")
        if base_seed is None:
            base_seed = int(torch.randint(0, 2**31 - config.members, ()).item())
        self.base_seed = base_seed
        members = []
        for k in range(config.members):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(base_seed + k)
                members.append(Controller(make_encoder(config.encoder), GMLEHead(config.nac_config(), config.nll_beta),
                                          config.encoder.token_dim, config.speed_input))
        self.members = nn.ModuleList(members)
        self.calibration: Calibration | None = None  # of the mixture (set by load_run), the members have none
        self.density: FeatureDensity | None = None  # over the members' features side by side (set by load_run)

    def member_parameters(self, k: int) -> Iterator[nn.Parameter]:
        return self.members[k].parameters()

    def member_loss(self, k: int, frames: torch.Tensor, timestamps: torch.Tensor, target: torch.Tensor,
                    perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    speed: torch.Tensor | None = None, anchor: Anchor | None = None) -> dict[str, torch.Tensor]:
        """Loss terms of member k alone (for trainers that give each member its own data order)."""
        return self.members[k].training_loss(frames, timestamps, target, perturb, speed, anchor)

    def training_loss(self, frames: torch.Tensor, timestamps: torch.Tensor, target: torch.Tensor,
                      perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      speed: torch.Tensor | None = None, anchor: Anchor | None = None) -> dict[str, torch.Tensor]:
        """``total`` = Σ_k member loss on the same batch (each with its own ``anchor`` consistency); ``member{k}``
        (detached) for logging."""
        return self.views_loss([MemberView(frames, target, anchor)] * len(self.members), timestamps, perturb, speed)

    def views_loss(self, views: Sequence[MemberView], timestamps: torch.Tensor,
                   perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   speed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """As :meth:`training_loss`, member k on its own view ``views[k]`` of the batch (the same
        sequences, augmented differently): ensembles made diverse by what each member sees."""
        losses = [member.training_loss(view.frames, timestamps, view.target, perturb, speed, view.anchor)["total"]
                  for member, view in zip(self.members, views, strict=True)]
        terms = {"total": torch.stack(losses).sum()}
        terms.update({f"member{k}": loss.detach() for k, loss in enumerate(losses)})
        return terms

    @property
    def speed_input(self) -> bool:
        return self.members[0].speed_input

    @torch.no_grad()
    def encode(self, frames: torch.Tensor, speed: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's tokens, stacked: [M, B, T, D] (cacheable per frame like :meth:`Controller.encode`)."""
        return torch.stack([member.encode(frames, speed) for member in self.members])

    @torch.no_grad()
    def predict_tokens(self, tokens: torch.Tensor, timestamps: torch.Tensor, samples: int = 20,
                       generators: Sequence[torch.Generator] | None = None) -> UncertainPrediction:
        """Uniform Gaussian mixture of the members (``samples``/``generators`` are unused: members are deterministic)."""
        predictions = [member.predict_tokens(member_tokens, timestamps, samples)
                       for member, member_tokens in zip(self.members, tokens)]
        means = torch.stack([p.mean for p in predictions])
        variances = torch.stack([p.aleatoric for p in predictions])
        density = None if self.density is None else self.density.score(self.density_features(tokens))
        return calibrated(self.calibration, UncertainPrediction(means.mean(0), variances.mean(0), means.var(0, unbiased=False),
                                                                density=density))

    def use_density_source(self, source: str) -> None:
        """Every member's :meth:`encode` emits what ``source`` reads (:meth:`Controller.use_density_source`)."""
        for member in self.members:
            member.use_density_source(source)

    def density_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every member's density features side by side, [B, M·D] (tokens [M, B, T·K, D] from :meth:`encode`)."""
        return torch.cat([member.density_features(member_tokens) for member, member_tokens in zip(self.members, tokens)], -1)

    @torch.no_grad()
    def predict(self, frames: torch.Tensor, timestamps: torch.Tensor, samples: int = 20,
                speed: torch.Tensor | None = None) -> UncertainPrediction:
        """Uniform Gaussian mixture of the members' predictions for ``frames``."""
        return self.predict_tokens(self.encode(frames, speed), timestamps, samples)


# ------------------------------------------------------------------- Deep Evidential Regression


def nig_nll(y: torch.Tensor, gamma: torch.Tensor, nu: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Elementwise −log p(y | γ, ν, α, β) of the Normal-Inverse-Gamma evidential model.

    NLL = ½log(π/ν) − α log Ω + (α+½) log(ν(y−γ)² + Ω) + lnΓ(α) − lnΓ(α+½),  Ω = 2β(1+ν):
    the Student-t with 2α degrees of freedom, location γ and scale² β(1+ν)/(να).
    """
    omega = 2 * beta * (1 + nu)
    return (0.5 * torch.log(math.pi / nu) - alpha * torch.log(omega)
            + (alpha + 0.5) * torch.log(nu * (y - gamma).square() + omega)
            + torch.lgamma(alpha) - torch.lgamma(alpha + 0.5))


def nig_regulariser(y: torch.Tensor, gamma: torch.Tensor, nu: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise evidence regulariser |y − γ|·(2ν + α) (Amini et al. 2020, as in their package)."""
    return (y - gamma).abs() * (2 * nu + alpha)


class EvidentialHead(UncertaintyHead):
    """NAC features → Linear(d, 4·3) → per action (γ, ν, α, β) of a Normal-Inverse-Gamma.

    γ = squash(raw) (inside the action box), ν = softplus + 1e-6, α = softplus + 1 + 1e-6,
    β = softplus + 1e-6. Loss = mean NIG NLL + coeff · mean |y − γ|(2ν + α).

    ``coeff`` (``ModelConfig.evidential_coeff``) defaults to 0.01, the value Amini et al. use in
    their examples; the ``evidential_deep_learning`` package default of 1.0 (what the published
    wrapper ran) shrinks the evidence so strongly that both variances are inflated everywhere.

    Prediction per sample and action (never dataset-mean scalars): mean = γ,
    aleatoric = E[σ²] = β/(α−1), epistemic = Var[μ] = β/(ν(α−1)). ``samples`` is unused.
    """

    def __init__(self, config: NACConfig, coeff: float = 0.01) -> None:
        super().__init__()
        if coeff < 0:
            raise ValueError(f"evidential coeff must be >= 0, got {coeff}")
        self.nac = NAC(config)
        self.evidence = nn.Linear(config.d_model, 4 * N_ACTIONS)
        self.coeff = coeff

    def nig(self, tokens: torch.Tensor, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(γ, ν, α, β), each [B, 3]."""
        raw_gamma, raw_nu, raw_alpha, raw_beta = self.evidence(self.nac(tokens, times)).split(N_ACTIONS, dim=-1)
        return (squash(raw_gamma), F.softplus(raw_nu) + 1e-6, F.softplus(raw_alpha) + 1.0 + 1e-6,
                F.softplus(raw_beta) + 1e-6)

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        gamma, nu, alpha, beta = self.nig(tokens, times)
        check_targets(gamma, target)
        nll = nig_nll(target, gamma, nu, alpha, beta).mean()
        regulariser = nig_regulariser(target, gamma, nu, alpha).mean()
        return {"total": nll + self.coeff * regulariser, "nll": nll.detach(), "regulariser": regulariser.detach()}

    def predict(self, tokens, times, samples):
        gamma, nu, alpha, beta = self.nig(tokens, times)
        aleatoric = beta / (alpha - 1)
        return UncertainPrediction(gamma, aleatoric, aleatoric / nu)


# ------------------------------------------------------------------------------------- SDE-Net


class SDENetHead(UncertaintyHead):
    """SDE-Net (Kong et al. 2020) over the whole token sequence.

    * Temporal summary: a one-layer GRU (hidden d) over [token_t ; t_t] (t = 1 + timestamp),
      its final state is h₀ ∈ R^d (the paper's "downsampling" layer; the published wrapper saw
      the last frame only).
    * Drift f(h) = Linear(d, d) ∘ tanh ∘ Linear(d, d) (time-homogeneous, as in the paper).
    * Diffusion g(h₀) = σ_max · sigmoid(MLP(h₀)), one scalar per sample, computed once from h₀.
    * Euler–Maruyama over t ∈ [0, 1] with L = ``depth`` steps, Δt = 1/L:
      h ← h + f(h)Δt + g√Δt ξ, ξ ~ N(0, I). (The published scripts used Δt = 4/L; with Δt = 1/L
      the total injected noise has std ≈ g per coordinate, so σ_max has a direct meaning.)
    * Read-out: Gaussian head on h_L (squashed mean, log σ).

    Training (``training_loss`` needs ``perturbed_tokens``): total = NLL + BCE where
    NLL is the Gaussian NLL of ONE SDE path per sample on clean tokens, and BCE trains the
    diffusion net's logit towards 0 (sigmoid → 0) on clean and 1 on perturbed tokens. As in the
    paper (separate optimisers), the two terms train disjoint parameters: in the NLL the diffusion
    value is detached (summary, drift and read-out learn from the NLL only), and the diffusion net
    sees detached h₀ in the BCE (it learns from the separation loss only; no BCE gradient reaches
    the summary or the encoder). They are summed into one ``total`` because the trainer uses one
    optimiser; with disjoint parameters and Adam that is the same as two optimisers.

    Prediction: h₀ and g computed once, S paths integrated together ([S, B, d]), epistemic =
    Var_s of the squashed path means, aleatoric = mean_s e^{2 log σ_s} (log σ clamped to [−10, 5]).
    """

    uses_perturbed_inputs = True

    stochastic_prediction = True

    def __init__(self, token_dim: int, d_model: int = 64, depth: int = 6, sigma_max: float = 0.5, nll_beta: float = 0.0) -> None:
        super().__init__()
        self.nll_beta = nll_beta
        if depth < 1:
            raise ValueError(f"sde_depth must be >= 1, got {depth}")
        if sigma_max < 0:
            raise ValueError(f"sde_sigma_max must be >= 0, got {sigma_max}")
        self.token_dim = token_dim
        self.depth = depth
        self.sigma_max = sigma_max
        self.summary = nn.GRU(token_dim + 1, d_model, batch_first=True)
        self.drift = nn.Sequential(nn.Linear(d_model, d_model), nn.Tanh(), nn.Linear(d_model, d_model))
        self.diffusion_net = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))
        self.gaussian = GaussianHead(d_model)

    def encode(self, tokens: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """h₀ [B, d]: final GRU state over the token sequence with its times."""
        validate_inputs(tokens, times, None, self.token_dim)
        _, state = self.summary(torch.cat([tokens, times[..., None].to(tokens)], dim=-1))
        return state[-1]

    def diffusion_logit(self, h0: torch.Tensor) -> torch.Tensor:
        return self.diffusion_net(h0).squeeze(-1)

    def diffusion(self, tokens: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """g [B] ∈ [0, σ_max]: the diffusion the SDE would use for these inputs."""
        return self.sigma_max * torch.sigmoid(self.diffusion_logit(self.encode(tokens, times)))

    def integrate(self, h0: torch.Tensor, g: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Euler–Maruyama, L steps of Δt = 1/L; h0 [..., d], g [...] → h_L [..., d] (one path per row)."""
        dt = 1.0 / self.depth
        noise_scale = (g * math.sqrt(dt))[..., None]
        h = h0
        for _ in range(self.depth):
            xi = randn_like_on(h.shape, generator, h)
            h = h + self.drift(h) * dt + noise_scale * xi
        return h

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        if perturbed_tokens is None:
            raise ValueError("SDENetHead.training_loss needs perturbed_tokens (the diffusion net's separation loss)")
        h0 = self.encode(tokens, times)
        with torch.no_grad():
            g = self.sigma_max * torch.sigmoid(self.diffusion_logit(h0))
            h0_perturbed = self.encode(perturbed_tokens, times[:perturbed_tokens.shape[0]])
        mean, log_sigma = self.gaussian(self.integrate(h0, g))
        nll = gaussian_nll(mean, log_sigma, target, self.nll_beta)
        logit_clean = self.diffusion_logit(h0.detach())
        logit_perturbed = self.diffusion_logit(h0_perturbed)
        bce = (F.binary_cross_entropy_with_logits(logit_clean, torch.zeros_like(logit_clean))
               + F.binary_cross_entropy_with_logits(logit_perturbed, torch.ones_like(logit_perturbed)))
        return {"total": nll + bce, "nll": nll.detach(), "diffusion_bce": bce.detach(),
                "diffusion_clean": g.mean(), "diffusion_perturbed": self.sigma_max * torch.sigmoid(logit_perturbed).mean().detach()}

    def predict(self, tokens, times, samples):
        _check_samples(samples)
        h0 = self.encode(tokens, times)
        g = self.sigma_max * torch.sigmoid(self.diffusion_logit(h0))
        h = self.integrate(h0.expand(samples, *h0.shape), g.expand(samples, *g.shape))
        mean, log_sigma = self.gaussian(h)  # [S, B, 3]
        return decompose(mean, log_sigma.clamp(*LOG_SIGMA_BOUNDS))


__all__ = ["MCDropoutHead", "EnsembleController", "EvidentialHead", "SDENetHead", "forced_dropout", "nig_nll",
           "nig_regulariser"]
