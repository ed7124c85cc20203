"""Uncertainty heads: tokens [B, T, F] (+ times [B, T]) → (steer, gas, brake) with uncertainty.

Every head implements the same two methods, so training, evaluation and driving never branch
on the model:

* ``training_loss(tokens, times, target, perturbed_tokens=None) -> dict`` with key ``"total"``
  (heads with ``uses_perturbed_inputs = True`` get tokens of perturbed frames as well);
* ``predict(tokens, times, samples) -> UncertainPrediction`` in action units (mean inside the
  action box, aleatoric and epistemic variance), see :mod:`nsacdrive.controllers.actions`;
* ``predict_episodes(tokens, times, samples, generators)``: the same for a batch whose rows are
  independent episodes, row b drawing its randomness from ``generators[b]`` only, so batched
  closed-loop evaluation gives every episode its own reproducible random stream.

Times follow one convention: ``t = 1 + timestamp`` with timestamps in seconds relative to the
newest frame (so t = 1 at the newest frame, 0.94 three frames earlier at 50 Hz).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from nsacdrive.controllers.actions import ACTION_NAMES, squash
from nsacdrive.controllers.censored import action_nll, censored_prediction, to_action_box
from nsacdrive.controllers.nsac import (
    LOG_SIGMA_BOUNDS,
    NAC,
    NSAC,
    Generators,
    NACConfig,
    NSACConfig,
    NSACOutput,
    attention_per_position,
)
from nsacdrive.controllers.objectives import NSACObjective, beta_weighted_mean, check_targets, gaussian_nll
from nsacdrive.controllers.prediction import UncertainPrediction, decompose

N_ACTIONS = len(ACTION_NAMES)


@contextmanager
def global_rng_from(generator: torch.Generator) -> Iterator[None]:
    """Run the body on the global CPU RNG set to ``generator``'s state, then hand the advanced state
    back to ``generator`` and restore the global one (for layers, like dropout, that take no generator)."""
    saved = torch.get_rng_state()
    torch.set_rng_state(generator.get_state())
    try:
        yield
    finally:
        generator.set_state(torch.get_rng_state())
        torch.set_rng_state(saved)


class UncertaintyHead(nn.Module):
    """Base class: see the module docstring for the contract."""

    uses_perturbed_inputs: ClassVar[bool] = False
    #: whether ``predict`` draws random numbers (MC draws); deterministic heads batch freely
    stochastic_prediction: ClassVar[bool] = False
    #: during a row-by-row :meth:`predict_episodes`, the batch row being predicted (else None)
    episode_row: int | None = None

    def training_loss(self, tokens: torch.Tensor, times: torch.Tensor, target: torch.Tensor,
                      perturbed_tokens: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def predict(self, tokens: torch.Tensor, times: torch.Tensor, samples: int) -> UncertainPrediction:
        raise NotImplementedError

    def predict_episodes(self, tokens: torch.Tensor, times: torch.Tensor, samples: int,
                         generators: Sequence[torch.Generator]) -> UncertainPrediction:
        """:meth:`predict` with row b's draws taken from ``generators[b]``.

        Deterministic heads make one batched call; stochastic heads default to one call per row
        on that row's stream (heads that can draw per row in one pass override this: NSAC)."""
        if not self.stochastic_prediction:
            return self.predict(tokens, times, samples)
        parts = []
        try:
            for row, generator in enumerate(generators):
                self.episode_row = row  # which episode this call serves (read by recorders' hooks)
                with global_rng_from(generator):
                    parts.append(self.predict(tokens[row:row + 1], times[row:row + 1], samples))
        finally:
            self.episode_row = None
        return UncertainPrediction.cat(parts)


class NSACHead(UncertaintyHead):
    """NSAC with the two-term objective; S draws batched inside the layer for training and prediction."""

    uses_perturbed_inputs = True
    stochastic_prediction = True

    def __init__(self, config: NSACConfig, train_samples: int = 5, objective: NSACObjective = NSACObjective()) -> None:
        super().__init__()
        if config.output_dim != N_ACTIONS:
            raise ValueError(f"NSACHead needs output_dim={N_ACTIONS}, got {config.output_dim}")
        if train_samples < 2:
            raise ValueError("train_samples must be >= 2: the epistemic regulariser needs a spread")
        self.layer = NSAC(config)
        self.train_samples = train_samples
        self.objective = objective

    def draws(self, tokens: torch.Tensor, times: torch.Tensor, samples: int, return_internals: bool = False,
              generator: Generators = None) -> NSACOutput:
        out = self.layer(tokens, times, samples=samples, return_internals=return_internals, generator=generator)
        return NSACOutput(to_action_box(self.objective.censored_pedals)(out.mean), out.log_sigma, out.internals)

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        if perturbed_tokens is None:
            raise ValueError("NSACHead.training_loss needs perturbed_tokens (the epistemic regulariser)")
        clean = self.draws(tokens, times, self.train_samples)
        perturbed = self.draws(perturbed_tokens, times[:perturbed_tokens.shape[0]], self.train_samples)
        terms = self.objective(clean, perturbed, target)
        return {"total": terms.total, "nll": terms.nll, "regulariser": terms.regulariser,
                "epistemic_id": terms.epistemic_id, "epistemic_ood": terms.epistemic_ood}

    def predict(self, tokens, times, samples, generator: Generators = None):
        out = self.draws(tokens, times, samples, return_internals=True, generator=generator)
        if self.objective.censored_pedals:
            prediction = censored_prediction(out.mean, torch.exp(2 * out.log_sigma) + self.objective.epsilon)
        else:
            prediction = decompose(out.mean, out.log_sigma, variance_floor=self.objective.epsilon)  # the loss's variance
        prediction.attention = attention_per_position(out.internals, tokens.shape[1])
        return prediction

    def predict_episodes(self, tokens, times, samples, generators):
        return self.predict(tokens, times, samples, generator=generators)  # per-row noise in one pass


#: Linear log-σ read-outs (GaussianHead's, Lévy's) are unbounded: near ``gaussian_nll``'s hard clamp
#: at −10 an NLL term grows as e^{20}·r², and below it gets no gradient back (GMLE and Lévy on the
#: quality data: training losses of 10³–10⁴ from epoch 5 on). They are floored smoothly at
#: σ = e^{−4}, which bounds the term and keeps a gradient everywhere.
LOG_SIGMA_FLOOR = -4.0


def smooth_floor(x: torch.Tensor, floor: float) -> torch.Tensor:
    """floor + softplus(x − floor): ≈ x well above ``floor``, never below it, gradient never 0."""
    return floor + F.softplus(x - floor)


class GaussianHead(nn.Module):
    """Mean and log-σ read-outs of a feature vector, mean squashed into the action box (pedals into
    the latent range with ``censored_pedals``, :mod:`nsacdrive.controllers.censored`), log σ
    smoothly floored (:data:`LOG_SIGMA_FLOOR`)."""

    def __init__(self, features: int, censored_pedals: bool = False) -> None:
        super().__init__()
        self.censored_pedals = censored_pedals
        self.mean = nn.Linear(features, N_ACTIONS)
        self.log_sigma = nn.Linear(features, N_ACTIONS)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return to_action_box(self.censored_pedals)(self.mean(features)), smooth_floor(self.log_sigma(features), LOG_SIGMA_FLOOR)


class GMLEHead(UncertaintyHead):
    """NAC features + Gaussian maximum likelihood: aleatoric only, epistemic 0 by construction."""

    def __init__(self, config: NACConfig, nll_beta: float = 0.0, censored_pedals: bool = False) -> None:
        super().__init__()
        self.nac = NAC(config)
        self.gaussian = GaussianHead(config.d_model, censored_pedals)
        self.nll_beta = nll_beta

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        mean, log_sigma = self.gaussian(self.nac(tokens, times))
        if not self.gaussian.censored_pedals:
            return {"total": gaussian_nll(mean, log_sigma, target, self.nll_beta)}
        check_targets(mean, target)
        variance = torch.exp(2 * log_sigma.clamp(*LOG_SIGMA_BOUNDS))
        return {"total": beta_weighted_mean(action_nll(mean, variance, target, censored_pedals=True), variance, self.nll_beta)}

    def predict(self, tokens, times, samples):
        mean, log_sigma = self.gaussian(self.nac(tokens, times))
        log_sigma = log_sigma.clamp(*LOG_SIGMA_BOUNDS)  # as the loss clamps it
        if self.gaussian.censored_pedals:
            return censored_prediction(mean[None], torch.exp(2 * log_sigma[None]))
        return decompose(mean[None], log_sigma[None])


class LevyHead(UncertaintyHead):
    """Lévy attention with one query per action (docs/levy.md#action-head) over the frame tokens.

    Keys are the T frame tokens at index-space time t_f = 1 + timestamp / window (clipped to
    [0, 1]; the newest frame sits at t = 1) with a learned identity vector per frame slot. Mean:
    the deterministic mean path, squashed into the action box. Aleatoric: a per-action log-σ
    read-out of ā_k, smoothly floored at log σ = −4 (:data:`LOG_SIGMA_FLOOR`). Epistemic: the variance of the squashed actions over K draws of the
    layer's Poisson sampler (the "K-draw mode": the nonlinear action head sees every draw).
    Every prediction also carries the layer's evidence Λ, disagreement trΣ_V and deviation σ̂ per
    action (``signals``); ``nsacdrive calibrate`` maps σ̂ to an action-unit scale.
    """

    stochastic_prediction = True

    def __init__(self, token_dim: int, sequence_length: int, num_heads: int = 4, identity_dim: int = 16,
                 window: float = 0.5, sharpness: float = 1.0, nll_beta: float = 0.0) -> None:
        super().__init__()
        self.nll_beta = nll_beta
        from nsacdrive.controllers.levy import LevyActionHead, LevyActionHeadConfig, LevyAttentionConfig

        attention = LevyAttentionConfig(embed_dim=token_dim, num_heads=num_heads, identity_dim=identity_dim, beta=sharpness)
        self.actions = LevyActionHead(LevyActionHeadConfig(attention=attention, num_actions=N_ACTIONS))
        self.identity = nn.Parameter(0.5 * torch.randn(sequence_length, identity_dim))
        self.log_sigma_weight = nn.Parameter(torch.zeros(N_ACTIONS, token_dim))
        self.log_sigma_bias = nn.Parameter(torch.full((N_ACTIONS,), -1.0))
        self.window = window

    def _keys(self, tokens: torch.Tensor, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if tokens.shape[1] != self.identity.shape[0]:
            raise ValueError(f"LevyHead was built for {self.identity.shape[0]} frames, got {tokens.shape[1]}")
        key_times = (1.0 + (times - 1.0) / self.window).clamp(0.0, 1.0)
        return key_times, self.identity.expand(tokens.shape[0], -1, -1)

    def _mean_and_log_sigma(self, tokens, times):
        key_times, identity = self._keys(tokens, times)
        out = self.actions(tokens, key_times, identity)
        raw = torch.einsum("bae,ae->ba", out.attention.output, self.log_sigma_weight) + self.log_sigma_bias
        return squash(out.action), smooth_floor(raw, LOG_SIGMA_FLOOR), out

    def signals(self, tokens: torch.Tensor, times: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-action evidence Λ, disagreement trΣ_V and deviation σ̂, [B, 3] each."""
        _, _, out = self._mean_and_log_sigma(tokens, times)
        return {"evidence": out.attention.evidence, "disagreement": out.attention.disagreement,
                "deviation": out.attention.deviation}

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        mean, log_sigma, _ = self._mean_and_log_sigma(tokens, times)
        return {"total": gaussian_nll(mean, log_sigma, target, self.nll_beta)}

    def predict(self, tokens, times, samples):
        mean, log_sigma, out = self._mean_and_log_sigma(tokens, times)
        key_times, identity = self._keys(tokens, times)
        draws = squash(self.actions.sample(tokens, key_times, identity, draws=max(samples, 2)))
        aleatoric = torch.exp(2 * log_sigma.clamp(*LOG_SIGMA_BOUNDS))  # as gaussian_nll clamps it
        signals = {"evidence": out.attention.evidence, "disagreement": out.attention.disagreement, "deviation": out.attention.deviation}
        return UncertainPrediction(mean, aleatoric, draws.var(0, unbiased=False), signals=signals)


class NACRegressionHead(UncertaintyHead):
    """Plain NAC regression (the deterministic parent layer): MSE on the squashed mean.

    It has no uncertainty model, so for the probabilistic metrics it reports a homoscedastic
    aleatoric variance per action — the running mean of its squared training residuals — and
    zero epistemic variance: the "no uncertainty" reference every head must beat.
    """

    def __init__(self, config: NACConfig, momentum: float = 0.01) -> None:
        super().__init__()
        self.nac = NAC(config)
        self.mean = nn.Linear(config.d_model, N_ACTIONS)
        self.momentum = momentum
        self.register_buffer("residual_variance", torch.ones(N_ACTIONS))

    def training_loss(self, tokens, times, target, perturbed_tokens=None):
        mean = squash(self.mean(self.nac(tokens, times)))
        check_targets(mean, target)
        squared = (target - mean).square()
        if self.training:
            with torch.no_grad():
                self.residual_variance.lerp_(squared.mean(0).clamp_min(1e-6), self.momentum)
        return {"total": squared.mean()}

    def predict(self, tokens, times, samples):
        mean = squash(self.mean(self.nac(tokens, times)))
        return UncertainPrediction(mean, self.residual_variance.expand_as(mean).clone(), torch.zeros_like(mean))
