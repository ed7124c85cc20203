"""Neural Circuit Policy (NCP) wiring and the sparse feed-forward circuit built on it.

The wiring follows the AutoNCP rules described in docs/nsac.md#ncp-wiring (our own
generator, seeded; not bit-compatible with the ``ncps`` package): ``units`` neurons split into
motor (outputs), command and inter neurons; synapses run sensory→inter, inter→command,
command→command (recurrent) and command→motor with fan-outs set by the sparsity.

:class:`NCPCircuit` is the corrected NSAC backbone (docs/nsac.md#corrected-backbone): the wiring used as a sparse
feed-forward network ``inputs → inter → command → motor`` with tanh between layers, so its
outputs (φ, κ, ψ raw values) genuinely depend on the input. The recurrent command→command
synapses are not used by a feed-forward pass and are kept only in the wiring description.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

DEFAULT_WIRING_SEED = 22222  # the seed the published layers use for AutoNCP


@dataclass(frozen=True)
class NCPWiring:
    """Sparse ±1 adjacency blocks of an AutoNCP-style circuit.

    Neuron layout: motor ``[0, n_motor)``, command ``[n_motor, n_motor + n_command)``,
    inter ``[n_motor + n_command, units)``; the blocks below index each group from 0.
    """

    n_inputs: int
    n_inter: int
    n_command: int
    n_motor: int
    sensory_to_inter: np.ndarray  # (n_inputs, n_inter)
    inter_to_command: np.ndarray  # (n_inter, n_command)
    command_to_command: np.ndarray  # (n_command, n_command)
    command_to_motor: np.ndarray  # (n_command, n_motor)
    seed: int

    @property
    def units(self) -> int:
        return self.n_inter + self.n_command + self.n_motor

    @classmethod
    def auto(cls, n_inputs: int, units: int, n_motor: int, sparsity: float = 0.5, seed: int = DEFAULT_WIRING_SEED) -> "NCPWiring":
        """AutoNCP rules: 40 % of the non-motor neurons are command neurons, density = 1 − sparsity."""
        if not 0.1 <= sparsity <= 0.9:
            raise ValueError(f"sparsity must lie in [0.1, 0.9], got {sparsity}")
        if n_inputs < 1 or n_motor < 1 or units <= n_motor + 1:
            raise ValueError(f"need n_inputs >= 1, n_motor >= 1 and units > n_motor + 1; got {n_inputs}, {n_motor}, {units}")
        rng = np.random.RandomState(seed)
        n_ic = units - n_motor
        n_command = max(int(0.4 * n_ic), 1)
        n_inter = n_ic - n_command
        density = 1.0 - sparsity
        sensory_fanout = max(int(n_inter * density), 1)
        inter_fanout = max(int(n_command * density), 1)
        recurrent = max(int(2 * n_command * density), 1)
        motor_fanin = max(int(n_command * density), 1)

        def polarity() -> int:
            return int(rng.choice([-1, 1]))

        s2i = np.zeros((n_inputs, n_inter), dtype=np.int8)
        for src in range(n_inputs):
            for dst in rng.permutation(n_inter)[:sensory_fanout]:
                s2i[src, dst] = polarity()
        for dst in np.flatnonzero(~s2i.any(axis=0)):  # patch inter neurons nobody reaches
            for src in rng.permutation(n_inputs)[: max(int(n_inputs * sensory_fanout / n_inter), 1)]:
                s2i[src, dst] = polarity()
        i2c = np.zeros((n_inter, n_command), dtype=np.int8)
        for src in range(n_inter):
            for dst in rng.permutation(n_command)[:inter_fanout]:
                i2c[src, dst] = polarity()
        for dst in np.flatnonzero(~i2c.any(axis=0)):
            for src in rng.permutation(n_inter)[: max(int(n_inter * inter_fanout / n_command), 1)]:
                i2c[src, dst] = polarity()
        c2c = np.zeros((n_command, n_command), dtype=np.int8)
        for _ in range(recurrent):
            c2c[rng.randint(n_command), rng.randint(n_command)] = polarity()
        c2m = np.zeros((n_command, n_motor), dtype=np.int8)
        for dst in range(n_motor):
            for src in rng.permutation(n_command)[:motor_fanin]:
                c2m[src, dst] = polarity()
        return cls(n_inputs, n_inter, n_command, n_motor, s2i, i2c, c2c, c2m, seed)


@dataclass
class CircuitActivations:
    """Per-group activations of one circuit pass (leading dims as the input's)."""

    inter: torch.Tensor
    command: torch.Tensor
    motor: torch.Tensor

    def rows(self, rows: slice) -> "CircuitActivations":
        """The activations of batch rows ``rows`` (leading dim)."""
        return CircuitActivations(self.inter[rows], self.command[rows], self.motor[rows])


class MaskedLinear(nn.Linear):
    """A Linear layer whose weight is multiplied by a fixed 0/1 synapse mask."""

    def __init__(self, mask: np.ndarray) -> None:
        n_in, n_out = mask.shape
        super().__init__(n_in, n_out)
        self.register_buffer("mask", torch.as_tensor(np.abs(mask).T, dtype=torch.float32))
        with torch.no_grad():
            # Glorot scale for the synapses that exist, so sparse layers start like dense ones.
            fan_in = max(float(self.mask.sum(1).mean()), 1.0)
            fan_out = max(float(self.mask.sum(0).mean()), 1.0)
            bound = float(np.sqrt(6.0 / (fan_in + fan_out)))
            self.weight.uniform_(-bound, bound)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.mask, self.bias)


class NCPCircuit(nn.Module):
    """Sparse feed-forward pass over an NCP wiring: inputs → inter → command → motor."""

    def __init__(self, wiring: NCPWiring) -> None:
        super().__init__()
        self.wiring = wiring
        self.to_inter = MaskedLinear(wiring.sensory_to_inter)
        self.to_command = MaskedLinear(wiring.inter_to_command)
        self.to_motor = MaskedLinear(wiring.command_to_motor)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, CircuitActivations]:
        inter = torch.tanh(self.to_inter(x))
        command = torch.tanh(self.to_command(inter))
        motor = self.to_motor(command)
        return motor, CircuitActivations(inter, command, motor)
