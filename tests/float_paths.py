"""Tolerances for two float32 computations of the same quantity that round differently.

Two paths through one network — one frame at a time vs T frames batched, B rows vs 1 row, other
thread counts, other CPU kernels (oneDNN's AVX-512 vs AVX2 vs SSE4.1 convolutions, ATen's vector
width) — add the same products in different orders. A float32 sum of n products is within
γ_n ≈ n·u of the exact sum, relative to the sum of the terms' magnitudes (Higham, *Accuracy and
Stability of Numerical Algorithms*, §3.1), with u = 2⁻²⁴ the unit roundoff. Through a stack of
layers these first-order errors add up, so two paths differ by at most about u·Σₗ nₗ relative to
the magnitude of the quantity (not of each entry: an entry near zero after cancellation carries
the absolute error of its terms). That bound, from the model's own reduction lengths, is the
tolerance here: never the digits one machine happened to produce.

Bit-for-bit comparisons (``torch.equal``) stay only for identical computations: same shapes, same
order, same thread count, on one machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn

UNIT_ROUNDOFF = 2.0**-24


def reduction_lengths(model: nn.Module, tokens: int = 0) -> list[int]:
    """Terms summed per output of every convolution and linear map, plus the attention's sums.

    ``tokens``: how many positions an attention layer sums over (its softmax normaliser and its
    weighted sum of values each add ``tokens`` terms).
    """
    lengths = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Conv1d):
            kernel = 1
            for size in module.kernel_size:
                kernel *= size
            lengths.append(module.in_channels // module.groups * kernel)
        elif isinstance(module, nn.Linear):
            lengths.append(module.in_features)
    return lengths + [tokens, tokens] if tokens else lengths


def path_rtol(model: nn.Module, tokens: int = 0) -> float:
    """Relative tolerance of two float32 paths through ``model``: u·Σ reduction lengths."""
    return UNIT_ROUNDOFF * sum(reduction_lengths(model, tokens))


def assert_paths_agree(actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str = "") -> None:
    """``actual`` ≈ ``expected`` to ``rtol`` of their magnitude (the largest |entry|).

    Each entry is held to ``rtol`` of the quantity's scale, so entries that cancelled towards
    zero are not asked for relative accuracy their terms never had.
    """
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale + torch.finfo(torch.float32).tiny,
                               msg=lambda message: f"{what}: {message} (rtol {rtol:.2e} of scale {scale:.3e})")


def assert_predictions_agree(actual, expected, rtol: float, fields: Iterable[str] = ("mean", "aleatoric", "epistemic")) -> None:
    """Two :class:`UncertainPrediction` from different float paths agree field by field.

    ``aleatoric`` is e^{2ℓ} of a network output ℓ, so its relative error is twice ℓ's. ``epistemic``
    is the spread of the draws' means: an error δ in every mean moves it by about 2·σ·δ, so it is
    held to that (σ its own square root, δ the mean's tolerance), not to a relative bound.
    """
    for field in fields:
        a, b = getattr(actual, field), getattr(expected, field)
        if field == "mean":
            assert_paths_agree(a, b, rtol, field)
        elif field == "aleatoric":
            assert_paths_agree(a, b, 2 * rtol, field)
        elif field == "epistemic":
            mean_error = rtol * float(expected.mean.abs().max())
            atol = 2 * float(b.max().sqrt()) * mean_error + 2 * rtol * float(b.max()) + torch.finfo(torch.float32).tiny
            torch.testing.assert_close(a, b, rtol=2 * rtol, atol=atol, msg=lambda message: f"epistemic: {message}")
        else:
            raise ValueError(f"unknown prediction field {field!r}")


def prediction_row(prediction, index: int) -> SimpleNamespace:
    """Row ``index`` of a prediction's mean / aleatoric / epistemic, keeping the batch axis."""
    return SimpleNamespace(**{field: getattr(prediction, field)[index:index + 1] for field in ("mean", "aleatoric", "epistemic")})
