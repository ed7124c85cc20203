"""CarRacing colour augmentation: the mild jitter and the wide road/field recolouring."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nsacdrive.controllers.augment import AugmentConfig, colour_augment, mix_channels

ROAD = (102 / 255, 102 / 255, 102 / 255)
FIELD = (102 / 255, 204 / 255, 102 / 255)
WIDE_ONLY = AugmentConfig(probability=1.0, recolour=1.0, contrast=0.0, brightness=0.0)


def stock_frames(batch: int, steps: int = 3) -> torch.Tensor:
    """[B, T, 3, 8, 8] frames: left half stock road, right half stock field."""
    frames = torch.empty(batch, steps, 3, 8, 8)
    frames[..., :4] = torch.tensor(ROAD)[:, None, None]
    frames[..., 4:] = torch.tensor(FIELD)[:, None, None]
    return frames


def test_probability_zero_returns_the_frames_unchanged() -> None:
    frames = torch.rand(4, 2, 3, 8, 8)
    out = colour_augment(frames, AugmentConfig(probability=0.0, recolour=1.0), torch.Generator().manual_seed(0))
    assert torch.equal(out, frames)


def test_the_same_generator_seed_gives_the_same_recolouring_and_another_seed_does_not() -> None:
    frames = stock_frames(6)
    config = AugmentConfig(recolour=0.5)
    first = colour_augment(frames, config, torch.Generator().manual_seed(3))
    again = colour_augment(frames, config, torch.Generator().manual_seed(3))
    other = colour_augment(frames, config, torch.Generator().manual_seed(4))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_wide_recolouring_paints_road_and_field_one_colour_each_across_the_sequence() -> None:
    out = colour_augment(stock_frames(16), WIDE_ONLY, torch.Generator().manual_seed(0))
    road, field = out[..., :4], out[..., 4:]
    # every pixel of a region, in every frame of a sequence, gets the same colour
    assert torch.allclose(road, road[:, :1, :, :1, :1].expand_as(road), atol=1e-6)
    assert torch.allclose(field, field[:, :1, :, :1, :1].expand_as(field), atol=1e-6)


def test_wide_recolouring_reaches_any_road_and_field_colours() -> None:
    """Uniform in [0, 1]³ each: means near 0.5, and the road is brighter than the field in some samples."""
    out = colour_augment(stock_frames(2000, steps=1), WIDE_ONLY, torch.Generator().manual_seed(1))
    road, field = out[:, 0, :, 0, 0], out[:, 0, :, 0, -1]  # [B, 3]
    for colours in (road, field):
        assert torch.allclose(colours.mean(0), torch.full((3,), 0.5), atol=0.03)
        assert colours.min() < 0.02 and colours.max() > 0.98
    brighter_road = (road.mean(1) > field.mean(1)).float().mean()
    assert 0.4 < brighter_road < 0.6
    # road and field colours are drawn independently
    correlation = torch.corrcoef(torch.stack([road[:, 0], field[:, 0]]))[0, 1]
    assert abs(correlation) < 0.1


def test_mild_jitter_keeps_the_stock_road_darker_than_the_field() -> None:
    """Without the wide recolouring the default jitter never inverts road/field contrast."""
    out = colour_augment(stock_frames(500, steps=1), AugmentConfig(probability=1.0), torch.Generator().manual_seed(2))
    road, field = out[:, 0, :, 0, 0], out[:, 0, :, 0, -1]
    assert bool((road.mean(1) < field.mean(1)).all())


@pytest.mark.parametrize("recolour", [-0.1, 1.5])
def test_recolour_outside_the_unit_interval_is_refused(recolour: float) -> None:
    with pytest.raises(ValueError, match="recolour"):
        AugmentConfig(recolour=recolour)


# --------------------------------------------------------------------------- Udacity frames (YUV in [−1, 1])


def udacity_frames(rgb: torch.Tensor) -> torch.Tensor:
    """[B, T, 3, H, W] RGB in [0, 1] → the Udacity preprocessing's YUV in [−1, 1], through cv2 itself."""
    import cv2
    import numpy as np

    pixels = (rgb.permute(0, 1, 3, 4, 2).numpy() * 255).round().astype(np.uint8)
    yuv = cv2.cvtColor(pixels.reshape(-1, pixels.shape[-2], 3), cv2.COLOR_RGB2YUV).reshape(pixels.shape)
    return torch.from_numpy(yuv.astype(np.float32) / 127.5 - 1).permute(0, 1, 4, 2, 3)


def test_yuv_augmentation_recolours_as_the_rgb_augmentation_does_before_the_conversion() -> None:
    """Same generator seed: recolouring the YUV frames = recolouring RGB, then cv2's RGB → YUV, up to
    cv2's 8-bit rounding on either side (each ±0.5 of 255, amplified by the colour map: a few levels)."""
    from nsacdrive.controllers.augment import colour_augment_yuv

    rgb = stock_frames(8)
    rgb[..., :2, :] = torch.tensor((0.2, 0.4, 0.9))[:, None, None]  # a sky-blue band too
    config = AugmentConfig(probability=1.0, recolour=0.5)
    through_yuv = colour_augment_yuv(udacity_frames(rgb), config, torch.Generator().manual_seed(5))
    through_rgb = udacity_frames(colour_augment(rgb, config, torch.Generator().manual_seed(5)))
    assert (through_yuv - through_rgb).abs().max() < 4 / 127.5
    assert (through_yuv - udacity_frames(rgb)).abs().max() > 0.2  # it did recolour


def test_yuv_augmentation_at_probability_zero_returns_the_frames_unchanged() -> None:
    from nsacdrive.controllers.augment import colour_augment_yuv

    frames = udacity_frames(stock_frames(2))
    assert torch.equal(colour_augment_yuv(frames, AugmentConfig(probability=0.0), torch.Generator()), frames)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 3), steps=st.integers(1, 4), height=st.integers(1, 7), width=st.integers(1, 9),
       seed=st.integers(0, 2**31 - 1))
def test_mix_channels_applies_the_colour_matrix_to_every_pixel(batch: int, steps: int, height: int, width: int, seed: int) -> None:
    """``mix_channels`` = Σ_j M[i, j]·x_j at every pixel (float64 reference), to float32 rounding of
    a 3-term sum: |error| ≤ 3 ε Σ_j |M[i, j]·x_j|; a new contiguous tensor, the input untouched."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.rand(batch, steps, 3, height, width, generator=generator) * 2 - 1
    matrix = torch.randn(3, 3, generator=generator)
    before = frames.clone()
    mixed = mix_channels(matrix, frames)
    per_pixel = matrix.double()[:, :, None, None] * frames.double()[..., None, :, :, :]  # [B, T, i, j, H, W]
    expected, magnitude = per_pixel.sum(dim=-3), per_pixel.abs().sum(dim=-3)
    assert mixed.shape == frames.shape and mixed.is_contiguous() and torch.equal(frames, before)
    assert ((mixed.double() - expected).abs() <= 3 * torch.finfo(torch.float32).eps * magnitude + 1e-30).all()
