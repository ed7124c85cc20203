"""Bounded actions: (steer ∈ [−1, 1], gas ∈ [0, 1], brake ∈ [0, 1]).

Convention (documented once, used by every head): heads predict an unbounded raw mean per
draw/member, squashed into the action box — tanh for steer, sigmoid for gas and brake — BEFORE
moments are taken, so the predictive mean always lies inside the box and epistemic spread is
measured in action units. Aleatoric spread is predicted directly in action units. The
predictive Gaussian can still put mass outside the box; the driver clips the executed action
and the evaluator reports how often it had to.
"""

from __future__ import annotations

import numpy as np
import torch

ACTION_NAMES = ("steer", "gas", "brake")
ACTION_LOW = torch.tensor([-1.0, 0.0, 0.0])
ACTION_HIGH = torch.tensor([1.0, 1.0, 1.0])


def squash(raw: torch.Tensor) -> torch.Tensor:
    """Raw head means [..., 3] → action-box means (tanh steer, sigmoid pedals)."""
    if raw.shape[-1] != len(ACTION_NAMES):
        raise ValueError(f"expected {len(ACTION_NAMES)} action outputs in the last axis, got {raw.shape[-1]}")
    return torch.cat([torch.tanh(raw[..., :1]), torch.sigmoid(raw[..., 1:])], dim=-1)


def clip_to_box(action: torch.Tensor) -> torch.Tensor:
    return torch.maximum(torch.minimum(action, ACTION_HIGH.to(action)), ACTION_LOW.to(action))


def cautious_pedals(action: np.ndarray, std: np.ndarray, caution: float | None, gas_caution: float | None = None) -> np.ndarray:
    """Gas at its lower and brake at its upper k-σ bound, clipped to [0, 1] (no-op when caution is None).

    ``std``: the predictive std of (steer, gas, brake). Where the teacher sometimes brakes hard
    and sometimes not, a Gaussian head predicts a small mean brake with a wide spread; acting on
    the spread brakes there, while on a clear straight (small σ) the action hardly changes.
    ``gas_caution``: the gas's own k (0: caution on the brake alone, which costs less lap time);
    None: ``caution`` for both pedals.
    """
    if caution is None:
        return action
    cautious = action.copy()
    gas_k = caution if gas_caution is None else gas_caution
    cautious[1] = np.clip(action[1] - gas_k * std[1], 0.0, 1.0)
    cautious[2] = np.clip(action[2] + caution * std[2], 0.0, 1.0)
    return cautious
