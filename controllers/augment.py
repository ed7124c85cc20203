"""Colour augmentation on preprocessed frames [B, T, 3, H, W]: CarRacing's RGB in [0, 1], Udacity's YUV in [−1, 1].

Robustness to the colour presets (nsacdrive.envs.colours) depends on this, so it is configurable and
seeded. One set of parameters per sequence (all T frames of a sample get the same
transform, as a real colour shift would): hue rotation (YIQ rotation, radians), saturation,
contrast around the frame mean, brightness offset and per-channel gain; applied with
probability ``probability`` per sample. ``AugmentConfig(probability=0)`` disables it.

``recolour`` (probability per augmented sample, off by default) replaces the mild colour matrix
by a wide one: the affine RGB map that sends the stock road colour (102,102,102) and field
colour (102,204,102) to two independent uniform colours in [0, 1]³, scaling the other two
directions of colour space by U(0.5, 1.5). Road and field in stock frames differ only in green,
so this reaches any pair of road/field colours — brighter road than field, inverted contrast,
any hue — which a hue rotation around the stock colours never does (strong colour shifts such as
the ``random`` preset; docs/driving.md#colour-augmentation).

:func:`colour_augment_yuv` applies the same transform to Udacity-kind frames (the front-camera
simulator paints CarRacing's colours, so the same stock road and field apply): it maps the
frames back to RGB through cv2's RGB → YUV matrix, recolours, and maps forward again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nsacdrive.common.config_checks import NON_NEGATIVE, UNIT_INTERVAL, check_fields

_RGB_TO_YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ_TO_RGB = torch.linalg.inv(_RGB_TO_YIQ)
_STOCK_ROAD = torch.full((3,), 102 / 255)
_STOCK_FIELD_MINUS_ROAD = 102 / 255  # the stock field is the road plus this much green
# cv2's COLOR_RGB2YUV (8-bit): Y = 0.299 R + 0.587 G + 0.114 B, U = 0.492 (B − Y) + 128, V = 0.877 (R − Y) + 128
_LUMA = torch.tensor([0.299, 0.587, 0.114])
_RGB_TO_YUV = torch.stack([_LUMA, 0.492 * (torch.tensor([0.0, 0.0, 1.0]) - _LUMA), 0.877 * (torch.tensor([1.0, 0.0, 0.0]) - _LUMA)])
_YUV_TO_RGB = torch.linalg.inv(_RGB_TO_YUV)
_YUV_OFFSET = torch.tensor([0.0, 0.5, 0.5])  # 128/256 ≈ 0.5 of the [0, 1] range


#: the numbers AugmentConfig's fields may take
AUGMENT_RANGES = {"probability": UNIT_INTERVAL, "recolour": UNIT_INTERVAL,
                  **dict.fromkeys(("hue", "saturation", "contrast", "brightness", "channel_gain"), NON_NEGATIVE)}


@dataclass(frozen=True)
class AugmentConfig:
    probability: float = 0.8
    hue: float = 1.0  # max |rotation| of the chroma plane, radians
    saturation: float = 0.4
    contrast: float = 0.3
    brightness: float = 0.15
    channel_gain: float = 0.1
    recolour: float = 0.0  # probability that an augmented sample gets a wide recolouring instead

    def __post_init__(self) -> None:
        check_fields(self, "augment", AUGMENT_RANGES)


def colour_augment(frames: torch.Tensor, config: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """Randomly recoloured copy of ``frames`` (same shape, clipped to [0, 1])."""
    if config.probability == 0:
        return frames
    batch = frames.shape[0]

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(batch, *shape, generator=generator)

    apply = (torch.rand(batch, generator=generator) < config.probability).float()
    angle = uniform(-config.hue, config.hue) * apply
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation = torch.zeros(batch, 3, 3)
    rotation[:, 0, 0] = 1.0
    rotation[:, 1, 1], rotation[:, 1, 2], rotation[:, 2, 1], rotation[:, 2, 2] = cos, -sin, sin, cos
    saturation = 1 + uniform(-config.saturation, config.saturation) * apply
    rotation[:, 1:, 1:] *= saturation[:, None, None]
    colour = _YIQ_TO_RGB @ rotation @ _RGB_TO_YIQ  # [B, 3, 3]
    gain = 1 + uniform(-config.channel_gain, config.channel_gain, 3) * apply[:, None]
    colour = colour * gain[:, :, None]
    offset = None
    if config.recolour > 0:
        wide = (torch.rand(batch, generator=generator) < config.recolour) & apply.bool()
        wide_colour, wide_offset = _wide_recolouring(batch, generator)
        colour = torch.where(wide[:, None, None], wide_colour, colour)
        offset = torch.where(wide[:, None], wide_offset, 0.0)
    # in place on the new tensor from here on: each step is one pass over the batch and no fresh
    # allocation (the same values as out-of-place arithmetic, at a fraction of its memory traffic)
    # an einsum, not mix_channels: its strided result fixes the order in which the contrast's mean
    # below sums, and a contiguous one moves that mean by an ulp (and every model trained since)
    out = torch.einsum("bij,btjhw->btihw", colour.to(frames), frames)
    if offset is not None:  # only the wide recolouring shifts colours; the mild jitter is linear
        out.add_(offset.to(frames)[:, None, :, None, None])
    contrast = (1 + uniform(-config.contrast, config.contrast) * apply).to(frames)
    mean = out.mean(dim=(2, 3, 4), keepdim=True)
    out.sub_(mean).mul_(contrast[:, None, None, None, None]).add_(mean)
    out.add_((uniform(-config.brightness, config.brightness) * apply).to(frames)[:, None, None, None, None])
    return out.clamp_(0.0, 1.0)


def mix_channels(matrix: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """``matrix`` [3, 3] applied to the colour of every pixel of ``frames`` [B, T, 3, H, W]: a new
    contiguous tensor of the same shape.

    One matrix product per frame with its pixels as columns, reading the frames where they lie; an
    einsum over the channel axis first copies them channel-major and returns a strided view (2× slower
    on a front-camera batch on one thread, 5× on two; the same values)."""
    batch, length, channels, height, width = frames.shape
    return torch.matmul(matrix, frames.reshape(batch, length, channels, height * width)).view(frames.shape)


def _wide_recolouring(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine maps x ↦ A x + c [B, 3, 3], [B, 3] sending the stock road and field to random colours."""
    road = torch.rand(batch, 3, generator=generator)
    field = torch.rand(batch, 3, generator=generator)
    other_scale = 0.5 + torch.rand(batch, generator=generator)
    matrix = torch.eye(3).repeat(batch, 1, 1) * other_scale[:, None, None]
    matrix[:, :, 1] = (field - road) / _STOCK_FIELD_MINUS_ROAD  # green carries the road/field contrast
    offset = road - matrix @ _STOCK_ROAD
    return matrix, offset


def through_rgb(frames: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Udacity-kind frames (YUV scaled to [−1, 1]) mapped to RGB in [0, 1], through ``transform``, and
    back; same shape, clipped to [−1, 1]."""
    offset = _YUV_OFFSET.to(frames)[:, None, None]
    yuv = frames.add(1).div_(2).sub_(offset)  # in place after the first step, as in colour_augment
    rgb = mix_channels(_YUV_TO_RGB.to(frames), yuv).clamp_(0.0, 1.0)
    out = mix_channels(_RGB_TO_YUV.to(frames), transform(rgb))
    return out.add_(offset).mul_(2).sub_(1).clamp_(-1.0, 1.0)


def colour_augment_yuv(frames: torch.Tensor, config: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """:func:`colour_augment` for Udacity-kind frames (YUV scaled to [−1, 1]); same shape, clipped to [−1, 1]."""
    if config.probability == 0:
        return frames
    return through_rgb(frames, lambda rgb: colour_augment(rgb, config, generator))
