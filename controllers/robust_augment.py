"""Augmentation for appearance changes nobody can list in advance, on preprocessed frames [B, T, 3, H, W].

Colour augmentation (:mod:`nsacdrive.controllers.augment`) covers recolouring. This module breaks
the other shortcuts a network would learn from one camera and one light. Each family is a switch
of :class:`RobustAugmentConfig`, and a magnitude of 0 turns it off:

* **geometric** (as DrQ's random shifts, plus small rotations and zoom): one affine map per
  sequence, the same for its T frames (a camera that moved stays moved), borders replicated.
  ``flip`` mirrors left to right and negates the steering label. It is the only step that
  changes a label.
* **photometric**: gamma (dim or washed-out light), Gaussian blur (focus, motion), additive
  noise (a noisy sensor).
* **random convolution** (as in network randomisation): a random 3×3 convolution mixing the
  colour channels. It changes texture and colour together in ways no list of families holds.
* **random erasing** (as in cutout): a rectangle of one random colour over part of the frame, in
  the same place for the whole sequence, like something stuck on the lens.

``probability`` is the share of sequences that get any of this. Every draw comes from the
generator passed in, and the same number of draws are made whatever is applied. The output is
therefore a pure function of the frames, the labels and the generator's state. CarRacing frames
are RGB in [0, 1]. Udacity frames are YUV in [−1, 1] and are augmented in RGB
(:func:`robust_augment_yuv`).

:func:`consistency_loss` is the optional term between a clean view and its augmented view. It
pulls their tokens together, as SODA does for features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from nsacdrive.common.config_checks import UNIT_INTERVAL, Range, check_fields
from nsacdrive.controllers.augment import through_rgb

#: the numbers RobustAugmentConfig's fields may take
ROBUST_AUGMENT_RANGES = {"probability": UNIT_INTERVAL, "flip": UNIT_INTERVAL, "random_conv": UNIT_INTERVAL,
                         "shift": Range(0, 0.5), "rotation": Range(0, 45), "scale": Range(0, 1),
                         "gamma": Range(0, 2), "blur": Range(0, 3), "noise": Range(0, 0.5), "erase": UNIT_INTERVAL,
                         "erase_area": Range(0, 0.5, low_open=True)}
#: the widest blur kernel, in sigmas each side
_BLUR_SIGMAS = 2


@dataclass(frozen=True)
class RobustAugmentConfig:
    """Which augmentations a training run draws, and how strong each may be (0: off)."""

    probability: float = 0.0  # share of sequences augmented by this module (0: off)
    shift: float = 0.0  # max |translation|, share of the frame's width and height (DrQ's 4 px of 84 is 0.05)
    rotation: float = 0.0  # max |rotation|, degrees
    scale: float = 0.0  # max |log zoom|
    flip: float = 0.0  # probability of a left-right mirror, the steering label negated
    gamma: float = 0.0  # max |log gamma|
    blur: float = 0.0  # max Gaussian blur sigma, pixels
    noise: float = 0.0  # max std of additive Gaussian noise, in the [0, 1] range
    random_conv: float = 0.0  # probability of a random 3×3 colour-mixing convolution
    erase: float = 0.0  # probability of an erased rectangle (one colour, the same place in every frame)
    erase_area: float = 0.2  # the largest share of the frame a rectangle covers

    def __post_init__(self) -> None:
        check_fields(self, "robust_augment", ROBUST_AUGMENT_RANGES)

    @property
    def enabled(self) -> bool:
        return self.probability > 0


@dataclass(frozen=True)
class Augmented:
    """An augmented batch: frames, the labels that go with them, and which sequences were mirrored."""

    frames: torch.Tensor
    target: torch.Tensor
    flipped: torch.Tensor  # [B] bool


def _uniform(generator: torch.Generator, batch: int, magnitude: float) -> torch.Tensor:
    return (2 * torch.rand(batch, generator=generator) - 1) * magnitude


def _affine(frames: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Each sequence's frames [B, T, C, H, W] sampled through its own map ``theta`` [B, 2, 3] (borders replicated)."""
    batch, length, channels, height, width = frames.shape
    grid = F.affine_grid(theta.to(frames), [batch, length * channels, height, width], align_corners=False)
    images = frames.reshape(batch, length * channels, height, width)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False).view(frames.shape)


def _geometric(config: RobustAugmentConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence affine maps [B, 2, 3] (output → input coordinates in [−1, 1]) and which of them mirror."""
    angle = _uniform(generator, batch, math.radians(config.rotation))
    zoom = torch.exp(_uniform(generator, batch, config.scale))
    shift = torch.stack([_uniform(generator, batch, 2 * config.shift), _uniform(generator, batch, 2 * config.shift)], 1)
    flipped = torch.rand(batch, generator=generator) < config.flip
    mirror = 1.0 - 2.0 * flipped.float()
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos * mirror, -sin, shift[:, 0]], 1), torch.stack([sin * mirror, cos, shift[:, 1]], 1)], 1)
    return theta, flipped


def _blur(frames: torch.Tensor, sigma: torch.Tensor, max_sigma: float) -> torch.Tensor:
    """Each sequence blurred with its own Gaussian ``sigma`` [B] (separable; 0 leaves it as it was)."""
    batch, length, channels, height, width = frames.shape
    radius = max(1, math.ceil(_BLUR_SIGMAS * max_sigma))
    offsets = torch.arange(-radius, radius + 1, dtype=frames.dtype)
    weights = torch.exp(-0.5 * (offsets[None] / sigma.clamp_min(1e-3)[:, None].to(frames)) ** 2)
    weights = weights / weights.sum(1, keepdim=True)  # [B, K]
    kernel = weights.repeat_interleave(length * channels, 0)  # one per image plane
    planes = frames.reshape(1, batch * length * channels, height, width)
    planes = F.pad(planes, (radius, radius, radius, radius), mode="replicate")
    planes = F.conv2d(planes, kernel[:, None, None, :], groups=kernel.shape[0])
    planes = F.conv2d(planes, kernel[:, None, :, None], groups=kernel.shape[0])
    return planes.view(frames.shape)


def _random_conv(frames: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each sequence through its own random 3×3 convolution from 3 to 3 channels (Xavier-normal weights)."""
    batch, length, channels, height, width = frames.shape
    weights = torch.randn(batch * channels, channels, 3, 3, generator=generator) * math.sqrt(2.0 / (2 * 9 * channels))
    images = frames.transpose(0, 1).reshape(length, batch * channels, height, width)
    out = F.conv2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), weights.to(frames), groups=batch)
    return out.view(length, batch, channels, height, width).transpose(0, 1)


def _erase(frames: torch.Tensor, config: RobustAugmentConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each sequence's rectangle lies, [B, 1, 1, H, W] bool, and its colour [B, 1, C, 1, 1]:
    area U(2 %, ``erase_area``) of the frame, aspect ratio log-uniform in [1/3, 3], centre uniform."""
    batch, _, channels, height, width = frames.shape
    area = (0.02 + torch.rand(batch, generator=generator) * max(config.erase_area - 0.02, 0.0)) * height * width
    aspect = torch.exp(_uniform(generator, batch, math.log(3.0)))
    half_h, half_w = torch.sqrt(area * aspect) / 2, torch.sqrt(area / aspect) / 2
    centre = torch.rand(batch, 2, generator=generator) * torch.tensor([height, width])
    colour = torch.rand(batch, channels, generator=generator)
    rows, cols = torch.arange(height) + 0.5, torch.arange(width) + 0.5
    inside_rows = (rows[None] - centre[:, :1]).abs() <= half_h[:, None]  # [B, H]
    inside_cols = (cols[None] - centre[:, 1:]).abs() <= half_w[:, None]  # [B, W]
    mask = inside_rows[:, :, None] & inside_cols[:, None, :]
    return mask[:, None, None].to(frames.device), colour[:, None, :, None, None].to(frames)


def robust_augment(frames: torch.Tensor, target: torch.Tensor, config: RobustAugmentConfig,
                   generator: torch.Generator) -> Augmented:
    """``frames`` [B, T, 3, H, W] in [0, 1] and their labels ``target`` [B, 3] augmented as ``config``
    says (a new tensor; the inputs are left as they were)."""
    batch = frames.shape[0]
    unchanged = torch.zeros(batch, dtype=torch.bool)
    if not config.enabled:
        return Augmented(frames, target, unchanged)
    apply = torch.rand(batch, generator=generator) < config.probability
    theta, flipped = _geometric(config, batch, generator)
    flipped &= apply
    convolve = (torch.rand(batch, generator=generator) < config.random_conv) & apply
    log_gamma = _uniform(generator, batch, config.gamma)
    sigma = torch.rand(batch, generator=generator) * config.blur
    noise_std = torch.rand(batch, generator=generator) * config.noise
    noise_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    if config.erase:  # drawn only when asked for, so recipes without it keep their random streams
        erased = (torch.rand(batch, generator=generator) < config.erase) & apply
        region, colour = _erase(frames, config, generator)
    rows = apply.nonzero().flatten()
    out = frames.clone()
    if len(rows) == 0:
        return Augmented(out, target, unchanged)
    picked = frames[rows]
    if config.shift or config.rotation or config.scale or config.flip:
        picked = _affine(picked, theta[rows])
    if config.random_conv:
        mixed = _random_conv(picked, torch.Generator().manual_seed(noise_seed))
        picked = torch.where(convolve[rows].to(picked.device)[:, None, None, None, None], mixed, picked)
    picked = picked.clamp(0.0, 1.0)
    if config.gamma:
        picked = picked.clamp_min(1e-6).pow(torch.exp(log_gamma[rows]).to(picked)[:, None, None, None, None])
    if config.blur:
        picked = _blur(picked, sigma[rows], config.blur)
    if config.noise:
        draws = torch.randn(picked.shape, generator=torch.Generator().manual_seed(noise_seed + 1)).to(picked)
        picked = picked + draws * noise_std[rows].to(picked)[:, None, None, None, None]
    if config.erase:
        covered = region[rows] & erased[rows].to(picked.device)[:, None, None, None, None]
        picked = torch.where(covered, colour[rows], picked)
    out[rows] = picked.clamp(0.0, 1.0)
    labels = target.clone()
    labels[flipped.to(labels.device), 0] *= -1
    return Augmented(out, labels, flipped)


def robust_augment_yuv(frames: torch.Tensor, target: torch.Tensor, config: RobustAugmentConfig,
                       generator: torch.Generator) -> Augmented:
    """:func:`robust_augment` for Udacity-kind frames (YUV scaled to [−1, 1]), applied in RGB."""
    if not config.enabled:
        return Augmented(frames, target, torch.zeros(frames.shape[0], dtype=torch.bool))
    augmented: Augmented | None = None

    def augment(rgb: torch.Tensor) -> torch.Tensor:
        nonlocal augmented
        augmented = robust_augment(rgb, target, config, generator)
        return augmented.frames

    out = through_rgb(frames, augment)
    assert augmented is not None  # through_rgb called augment once
    return Augmented(out, augmented.target, augmented.flipped)


@dataclass(frozen=True)
class Anchor:
    """The clean views of an augmented batch, for :func:`consistency_loss`: frames, the term's weight,
    and which sequences it covers."""

    frames: torch.Tensor
    weight: float
    keep: torch.Tensor  # [B] bool


def consistency_loss(augmented: torch.Tensor, clean: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean squared distance between the unit-normalised tokens [B, N, D] of the augmented views and
    of their clean views (no gradient through ``clean``), over the sequences ``keep`` [B] selects (a
    mirrored view is another scene, not the same one: leave it out). 0 when none is kept."""
    if not bool(keep.any()):
        return augmented.sum() * 0.0
    a = F.normalize(augmented[keep], dim=-1)
    b = F.normalize(clean[keep].detach(), dim=-1)
    return (a - b).pow(2).sum(-1).mean()
