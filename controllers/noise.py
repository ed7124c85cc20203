"""Random draws that follow their generator: one place decides where noise is drawn.

Episodes and training batches draw from seeded CPU ``torch.Generator`` streams. A tensor on an
accelerator cannot take noise from a CPU generator directly, so the draws happen on the
generator's device and are moved to the tensor's: a model on a GPU then gets the very numbers
it would get on the CPU (its episodes and runs stay comparable across devices).
"""

from __future__ import annotations

import torch


def randn_like_on(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """N(0, 1) draws of ``shape`` with ``like``'s dtype on ``like``'s device, drawn on the
    generator's device (``like``'s when there is none)."""
    device = like.device if generator is None else generator.device
    return torch.randn(shape, generator=generator, device=device, dtype=like.dtype).to(like.device)


def poisson_on(rates: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Poisson counts of ``rates`` on ``rates``' device, drawn on the generator's device."""
    device = rates.device if generator is None else generator.device
    return torch.poisson(rates.to(device), generator=generator).to(rates.device)
