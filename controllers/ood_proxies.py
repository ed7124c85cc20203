"""Out-of-distribution proxies for NSAC's epistemic regulariser: perturbed twins of a training batch.

The regulariser needs inputs the controller should be unsure about. Pixel noise (``noise``, the
published proxy) barely moves a trained encoder's tokens, so there is little to separate.
``proxies`` draws, per sequence, one of three families that are held out of both
the training colour augmentation and the evaluation corruption suite (``nsacdrive env
corruptions``), so the suite still measures generalisation rather than memorised corruptions:

* ``shuffle`` — the frame cut into a 4 × 4 grid whose cells are permuted (the same permutation
  for all T frames): local statistics stay, the road's layout is destroyed;
* ``blend`` — an even mix (weight U(0.4, 0.6)) with another sequence of the batch: two roads at once;
* ``noise`` — Gaussian pixel noise of std ``noise_std`` (the published proxy, kept as one of three).

Frames are preprocessed tensors [B, T, C, H, W] in any value range; everything is batched and
drawn from one generator, so a seed reproduces the same twins.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PERTURBATIONS = ("noise", "proxies")
PROXY_FAMILIES = ("shuffle", "blend", "noise")
GRID = 4


def shuffle_cells(frames: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Permute the cells of a GRID × GRID partition of each sequence's frames (one permutation per
    sequence); rows and columns beyond the last whole cell stay in place."""
    b, t, c, h, w = frames.shape
    ch, cw = h // GRID, w // GRID
    if ch == 0 or cw == 0:
        raise ValueError(f"frames of {h}×{w} px are too small for a {GRID}×{GRID} cell shuffle")
    order = torch.rand(b, GRID * GRID, generator=generator).argsort(dim=1).to(frames.device)
    body = frames[..., : GRID * ch, : GRID * cw]
    cells = body.reshape(b, t, c, GRID, ch, GRID, cw).permute(0, 3, 5, 1, 2, 4, 6).reshape(b, GRID * GRID, t, c, ch, cw)
    cells = cells[torch.arange(b, device=frames.device)[:, None], order]
    body = cells.reshape(b, GRID, GRID, t, c, ch, cw).permute(0, 3, 4, 1, 5, 2, 6).reshape(b, t, c, GRID * ch, GRID * cw)
    out = frames.clone()
    out[..., : GRID * ch, : GRID * cw] = body
    return out


def blend_with_other(frames: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each sequence mixed with the next one in the batch (the last with the first), weight U(0.4, 0.6)."""
    weight = (0.4 + 0.2 * torch.rand(frames.shape[0], generator=generator).to(frames)).view(-1, 1, 1, 1, 1)
    return weight * frames + (1 - weight) * frames.roll(1, dims=0)


def add_noise(frames: torch.Tensor, generator: torch.Generator, mean: float, std: float) -> torch.Tensor:
    return frames + mean + std * torch.randn(frames.shape, generator=generator).to(frames)


def twin_count(batch: int, fraction: float) -> int:
    """How many of a batch's sequences get a perturbed twin: round(fraction · batch), at least 1."""
    return max(1, round(fraction * batch))


def make_perturbation(kind: str, generator: torch.Generator, noise_mean: float, noise_std: float, fraction: float = 1.0
                      ) -> Callable[[torch.Tensor], torch.Tensor]:
    """frames [B, ...] → perturbed twins of the first :func:`twin_count` sequences (training batches are
    shuffled, so that is a random subset): ``noise`` only, or one of :data:`PROXY_FAMILIES` per sequence.

    A fraction below 1 makes the regulariser's second encoder pass that much cheaper; heads pair the
    twins with the first sequences of the clean batch.
    """
    if kind not in PERTURBATIONS:
        raise ValueError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {kind!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"twin fraction must be in (0, 1], got {fraction}")

    def noise(frames: torch.Tensor) -> torch.Tensor:
        return add_noise(frames, generator, noise_mean, noise_std)

    def proxies(frames: torch.Tensor) -> torch.Tensor:
        family = torch.randint(len(PROXY_FAMILIES), (frames.shape[0],), generator=generator).to(frames.device)
        candidates = torch.stack([shuffle_cells(frames, generator), blend_with_other(frames, generator), noise(frames)])
        return candidates[family, torch.arange(frames.shape[0], device=frames.device)]

    perturb = noise if kind == "noise" else proxies
    return lambda frames: perturb(frames[:twin_count(frames.shape[0], fraction)])
