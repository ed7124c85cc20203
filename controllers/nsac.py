"""NSAC: the Neuronal Stochastic Attention Circuit, and its deterministic parent NAC.

NSAC (docs/nsac.md#ou-attention-logits): for every query i and selected key j a circuit maps the pair
feature p_ij to the parameters of an Ornstein–Uhlenbeck SDE, φ (equilibrium), κ (mean
reversion) and ψ (diffusion). The attention logit is the closed-form OU marginal at the gated
time τ_ij,

    a_ij ~ N(μ_ij, σ_ij²),  μ_ij = φ + (a₀ − φ)·e^{−κτ},  σ_ij² = ψ²/(2κ)·(1 − e^{−2κτ}),

drawn as μ + σ·ε with ε ~ N(bn_mean, bn_std²), and α = softmax_j(a) is a logistic-normal random
simplex vector. Values are averaged with α, heads are combined, a double-width projection
feeds a mean head and a log-σ head.

``mode="corrected"`` (default) is what the paper intends: the circuit is the NCP wiring used as
a sparse feed-forward network (genuinely input-dependent φ, κ, ψ), bn_std = 1, per-token times
enter the gate, exact top-K, padded keys masked by −∞, log σ clamped to [−10, 5].
``mode="reference"`` reproduces the published layer for parity studies: the backbone is one
recurrent step from a zero state, which makes φ, κ, ψ input-independent constants; bn_std = 0.1;
block top-K with tail drop; t ≡ 1; multiplicative masking; no clamp.

Monte Carlo is batched inside the layer: features, projections, key selection, the circuit
and the OU moments are computed once, and S noise draws share them
(:meth:`NSAC.predict`), instead of S full passes of the whole network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Union

import torch
from torch import nn
from torch.nn import functional as F

from nsacdrive.controllers.circuit_attention import (
    CircuitAttentionConfig,
    CircuitAttentionCore,
    SelectedPairs,
    glorot_linear,
    validate_inputs,
)
from nsacdrive.controllers.ncp import CircuitActivations, NCPCircuit, NCPWiring
from nsacdrive.controllers.noise import randn_like_on
from nsacdrive.controllers.prediction import UncertainPrediction, decompose

ACTIVATIONS = {"identity": nn.Identity, "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}
LOG_SIGMA_BOUNDS = (-10.0, 5.0)


def make_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class ReferenceBackbone(nn.Module):
    """The published backbone: ONE step of an NCP cell from a zero state (docs/nsac.md#reference-backbone).

    Its input group excludes the motor (output) neurons, so the outputs are
    ``b[motor]·w_out + b_out`` whatever the pair feature: constants with an exactly zero
    gradient into the input kernel. Kept verbatim so parity studies can port published weights
    (r_k = b[k]·w_out,k + b_out,k).
    """

    def __init__(self, n_inputs: int, units: int, n_outputs: int) -> None:
        super().__init__()
        self.n_outputs = n_outputs
        self.input_kernel = nn.Parameter(nn.init.xavier_uniform_(torch.empty(n_inputs, units)))
        self.bias = nn.Parameter(torch.zeros(units))
        self.input_scale = nn.Parameter(torch.ones(n_inputs))
        self.input_shift = nn.Parameter(torch.zeros(n_inputs))
        self.output_scale = nn.Parameter(torch.ones(n_outputs))
        self.output_shift = nn.Parameter(torch.zeros(n_outputs))
        # Motor neurons [0, n_outputs) get no input synapse: the input mask is 0 on their columns.
        self.register_buffer("motor_input_mask", torch.zeros(n_inputs, n_outputs))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, CircuitActivations]:
        drive = (x * self.input_scale + self.input_shift) @ (self.input_kernel[:, : self.n_outputs] * self.motor_input_mask)
        motor = (drive + self.bias[: self.n_outputs]) * self.output_scale + self.output_shift
        return motor, CircuitActivations(inter=drive, command=drive, motor=motor)


def make_backbone(config: CircuitAttentionConfig, n_outputs: int) -> nn.Module:
    n_inputs = 2 * config.head_dim
    if config.mode == "reference":
        return ReferenceBackbone(n_inputs, config.backbone_units, n_outputs)
    wiring = NCPWiring.auto(n_inputs, config.backbone_units, n_outputs, config.sparsity, config.wiring_seed)
    return NCPCircuit(wiring)


def ou_moments(phi: torch.Tensor, kappa: torch.Tensor, psi: torch.Tensor, tau: torch.Tensor,
               a0: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the OU marginal at time τ from a₀ (docs/nsac.md#ou-discretisation), numerically stable."""
    decay = torch.exp(-kappa * tau)
    mean = phi + (a0 - phi) * decay
    variance = psi.square() / (2 * kappa) * (-torch.expm1(-2 * kappa * tau))
    return mean, torch.sqrt(variance.clamp_min(1e-9))


# ---------------------------------------------------------------------------------------- NSAC


@dataclass(frozen=True)
class NSACConfig(CircuitAttentionConfig):
    """NSAC settings; ``bn_std=None`` means 1.0 in corrected mode and the published 0.1 in reference."""

    output_dim: int = 3
    bn_mean: float = 0.0
    bn_std: float | None = None
    a0: float = 0.0
    activation: str = "tanh"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.output_dim < 1:
            raise ValueError(f"output_dim must be >= 1, got {self.output_dim}")
        if self.bn_std is not None and self.bn_std < 0:
            raise ValueError(f"bn_std must be >= 0, got {self.bn_std}")
        make_activation(self.activation)

    @property
    def noise_std(self) -> float:
        if self.bn_std is not None:
            return self.bn_std
        return 1.0 if self.mode == "corrected" else 0.1


@dataclass
class NSACInternals:
    """What a forward pass computed, per pair [B, H, Tq, K] unless noted (for reports)."""

    key_index: torch.Tensor
    phi: torch.Tensor
    kappa: torch.Tensor
    psi: torch.Tensor
    effective_time: torch.Tensor
    ou_mean: torch.Tensor
    ou_std: torch.Tensor
    attention: torch.Tensor  # [S, B, H, Tq, K] logistic-normal weights of every draw
    circuit: CircuitActivations  # inter / command / motor activations [B, H, Tq, K, n_group]

    def rows(self, rows: slice) -> "NSACInternals":
        """The internals of batch rows ``rows`` (the draw axis of ``attention`` kept)."""
        return NSACInternals(self.key_index[rows], self.phi[rows], self.kappa[rows], self.psi[rows],
                             self.effective_time[rows], self.ou_mean[rows], self.ou_std[rows], self.attention[:, rows],
                             self.circuit.rows(rows))


@dataclass
class NSACOutput:
    """Per-draw predictions: mean and log σ, [S, B, out] (or [S, B, T, out] with return_sequences)."""

    mean: torch.Tensor
    log_sigma: torch.Tensor
    internals: NSACInternals | None = None


#: One generator for the whole batch, one per batch row (independent episodes), or None (global RNG).
Generators = Union[torch.Generator, Sequence[torch.Generator], None]


def standard_normal(shape: tuple[int, ...], generator: Generators, batch_dim: int, like: torch.Tensor) -> torch.Tensor:
    """N(0, 1) draws of ``shape``; with one generator per batch row, row b's draws come from
    ``generator[b]`` alone, so an episode's noise never depends on which episodes share its batch."""
    if generator is None or isinstance(generator, torch.Generator):
        return randn_like_on(shape, generator, like)
    if len(generator) != shape[batch_dim]:
        raise ValueError(f"got {len(generator)} generators for a batch of {shape[batch_dim]}")
    row = shape[:batch_dim] + shape[batch_dim + 1:]
    return torch.stack([randn_like_on(row, g, like) for g in generator], dim=batch_dim)



def scatter_to_positions(weights: torch.Tensor, key_index: torch.Tensor, length: int) -> torch.Tensor:
    """Weights of selected keys [..., K] → weight per input position [..., T] (0 where unselected)."""
    per_position = torch.zeros(*weights.shape[:-1], length, dtype=weights.dtype, device=weights.device)
    return per_position.scatter_add_(-1, key_index.expand_as(weights), weights)


def attention_per_position(internals: NSACInternals, length: int) -> torch.Tensor:
    """[B, T]: the newest query's attention on each of the T positions, averaged over draws and
    heads (top-K selects different keys per head, so weights are scattered back to positions)."""
    weights = internals.attention[:, :, :, -1].mean(0)  # [B, H, K]
    return scatter_to_positions(weights, internals.key_index[:, :, -1], length).mean(1)


class NSAC(nn.Module):
    """The NSAC layer + (μ, log σ) heads. Input x [B, T, input_dim]; t optional [B, T] times."""

    def __init__(self, config: NSACConfig) -> None:
        super().__init__()
        self.config = config
        self.core = CircuitAttentionCore(config)
        self.backbone = make_backbone(config, n_outputs=3)
        d = config.d_model
        self.projection = glorot_linear(d, 2 * d)
        self.activation = make_activation(config.activation)
        self.mean_head = glorot_linear(d, config.output_dim)
        self.log_sigma_head = glorot_linear(d, config.output_dim)

    def _circuit(self, x: torch.Tensor, t: torch.Tensor | None, key_mask: torch.Tensor | None):
        selected = self.core.select(x, key_mask)
        tau = self.core.time_gate(selected.pairs, t, sign=-1.0)
        raw, activations = self.backbone(selected.pairs)
        eps = self.config.tau_epsilon
        phi = torch.tanh(raw[..., 0])
        kappa = F.softplus(raw[..., 1]) + eps
        psi = F.softplus(raw[..., 2]) + eps
        ou_mean, ou_std = ou_moments(phi, kappa, psi, tau, self.config.a0)
        return selected, tau, phi, kappa, psi, ou_mean, ou_std, activations

    def _attend(self, selected: SelectedPairs, ou_mean: torch.Tensor, ou_std: torch.Tensor, samples: int,
                noise: bool, generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        shape = (samples, *ou_mean.shape)
        if noise and cfg.noise_std > 0:
            eps = standard_normal(shape, generator, batch_dim=1, like=ou_mean)
            logits = ou_mean + ou_std * (cfg.bn_mean + cfg.noise_std * eps)
        else:
            logits = (ou_mean + ou_std * cfg.bn_mean).expand(shape)
        if cfg.mode == "corrected":
            logits = logits.masked_fill(~selected.valid, float("-inf"))
        else:
            logits = logits * selected.valid  # published: multiplicative 0/1 mask
        attention = self.core.attention_dropout(torch.softmax(logits, dim=-1))
        mixed = (attention[..., None] * selected.values).sum(-2)  # [S, B, H, Tq, D]
        return attention, self.core.combine_heads(mixed)  # [S, B, Tq, d]

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, *, key_mask: torch.Tensor | None = None,
                samples: int = 1, noise: bool = True, return_internals: bool = False,
                generator: Generators = None) -> NSACOutput:
        """``samples`` logit draws share one pass of everything before the noise."""
        validate_inputs(x, t, key_mask, self.config.input_dim)
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        selected, tau, phi, kappa, psi, ou_mean, ou_std, activations = self._circuit(x, t, key_mask)
        attention, z = self._attend(selected, ou_mean, ou_std, samples, noise, generator)
        hidden = self.activation(self.projection(z))
        d = self.config.d_model
        mean = self.mean_head(hidden[..., :d])
        log_sigma = self.log_sigma_head(hidden[..., d:])
        if self.config.mode == "corrected":
            log_sigma = log_sigma.clamp(*LOG_SIGMA_BOUNDS)
        if not self.config.return_sequences:
            mean, log_sigma = mean[:, :, -1], log_sigma[:, :, -1]
        internals = None
        if return_internals:
            internals = NSACInternals(selected.index, phi, kappa, psi, tau, ou_mean, ou_std, attention, activations)
        return NSACOutput(mean, log_sigma, internals)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, t: torch.Tensor | None = None, *, key_mask: torch.Tensor | None = None,
                samples: int = 20, generator: Generators = None) -> UncertainPrediction:
        """Mean, aleatoric and epistemic variance from ``samples`` draws batched inside the layer."""
        out = self.forward(x, t, key_mask=key_mask, samples=samples, generator=generator)
        return decompose(out.mean, out.log_sigma)


# ---------------------------------------------------------------------------------------- NAC


@dataclass(frozen=True)
class NACConfig(CircuitAttentionConfig):
    """NAC settings (docs/nsac.md#nac-logits): deterministic logits from the ODE da/dt = −τ a + φ."""

    solver: Literal["exact", "steady", "euler"] = "exact"
    euler_steps: int = 5
    delta_t: float = 0.5
    use_riemann_sum: bool = True
    activation: str = "identity"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.solver not in ("exact", "steady", "euler"):
            raise ValueError(f"solver must be exact, steady or euler, got {self.solver!r}")
        make_activation(self.activation)


class NAC(nn.Module):
    """The Neuronal Attention Circuit: a deterministic feature layer, [B, T, F] → [B, d] (or [B, T, d])."""

    def __init__(self, config: NACConfig) -> None:
        super().__init__()
        self.config = config
        self.core = CircuitAttentionCore(config)
        self.backbone = make_backbone(config, n_outputs=1)
        self.output = glorot_linear(config.d_model, config.d_model)
        self.activation = make_activation(config.activation)

    def logits(self, phi: torch.Tensor, rate: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.solver == "exact":
            return phi / rate * (-torch.expm1(-rate * tau))
        if cfg.solver == "steady":
            return (phi / rate).expand_as(tau)
        a = torch.zeros_like(tau)
        for _ in range(cfg.euler_steps):  # a handful of fixed steps, as published (ignores τ_ij)
            a = a + cfg.delta_t * (phi - rate * a)
        return a

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, *, key_mask: torch.Tensor | None = None,
                return_attention: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        validate_inputs(x, t, key_mask, self.config.input_dim)
        selected = self.core.select(x, key_mask)
        tau = self.core.time_gate(selected.pairs, t, sign=1.0)
        raw, _ = self.backbone(selected.pairs)
        phi = torch.sigmoid(raw[..., 0])
        rate = F.softplus(raw[..., 0]) + self.config.tau_epsilon
        logits = self.logits(phi, rate, tau)
        if self.config.mode == "corrected":
            logits = logits.masked_fill(~selected.valid, float("-inf"))
        else:
            logits = logits * selected.valid
        attention = self.core.attention_dropout(torch.softmax(logits, dim=-1))
        weights = attention * tau if self.config.use_riemann_sum else attention
        mixed = self.core.combine_heads((weights[..., None] * selected.values).sum(-2))
        out = self.activation(self.output(mixed))
        if not self.config.return_sequences:
            out = out[:, -1]
        return (out, attention) if return_attention else out


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = ["NSAC", "NSACConfig", "NSACOutput", "NSACInternals", "NAC",
           "NACConfig", "ou_moments", "count_parameters"]
