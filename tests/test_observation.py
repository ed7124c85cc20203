"""preprocess_observation: the one pixel path shared by training and evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nsacdrive.envs.observation import (
    HUD_ROWS,
    PREPROCESSED_FRAME_SHAPE,
    RAW_FRAME_SHAPE,
    preprocess_observation,
)


def random_frames(*batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(*batch, 96, 96, 3), dtype=np.uint8)


def test_constants():
    assert RAW_FRAME_SHAPE == (96, 96, 3)
    assert HUD_ROWS == 12
    assert PREPROCESSED_FRAME_SHAPE == (3, 84, 96)


@pytest.mark.parametrize("batch", [(), (5,), (2, 4), (1, 2, 3)])
def test_shapes_and_dtype_over_batch_dims(batch):
    out = preprocess_observation(random_frames(*batch))
    assert out.shape == (*batch, 3, 84, 96)
    assert out.dtype == np.float32


def test_value_scaling_and_channel_order():
    frame = np.zeros((96, 96, 3), dtype=np.uint8)
    frame[..., 0] = 255
    frame[..., 1] = 51
    frame[..., 2] = 0
    out = preprocess_observation(frame)
    np.testing.assert_array_equal(out[0], np.ones((84, 96), dtype=np.float32))
    np.testing.assert_allclose(out[1], 0.2, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(out[2], 0.0)
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_pixel_mapping_is_transpose_of_top_rows():
    frame = random_frames(seed=3)
    out = preprocess_observation(frame)
    # out[c, y, x] == frame[y, x, c] / 255 for the 84 scene rows
    np.testing.assert_array_equal(out, np.transpose(frame[:84], (2, 0, 1)).astype(np.float32) / np.float32(255.0))
    assert out[1, 10, 20] == pytest.approx(frame[10, 20, 1] / 255.0)


def test_hud_rows_are_cropped():
    frame = np.full((96, 96, 3), 7, dtype=np.uint8)
    frame[84:] = 200  # marker in the 12 HUD rows
    out = preprocess_observation(frame)
    assert out.shape == (3, 84, 96)
    np.testing.assert_array_equal(out, np.float32(7 / 255.0))
    assert not np.any(np.isclose(out, 200 / 255.0))
    # a marker in the last scene row survives
    frame[83] = 99
    assert np.all(np.isclose(preprocess_observation(frame)[:, 83], 99 / 255.0))


def test_batches_are_processed_frame_by_frame():
    frames = random_frames(2, 3, seed=1)
    out = preprocess_observation(frames)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(out[i, j], preprocess_observation(frames[i, j]))


def test_input_is_not_modified():
    frame = random_frames(seed=2)
    copy = frame.copy()
    preprocess_observation(frame)
    np.testing.assert_array_equal(frame, copy)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint16, np.int8, bool])
def test_non_uint8_input_raises_type_error(dtype):
    with pytest.raises(TypeError, match="uint8"):
        preprocess_observation(np.zeros((96, 96, 3), dtype=dtype))


def test_float_frames_in_unit_range_are_still_rejected():
    with pytest.raises(TypeError, match=str(np.dtype(np.float32))):
        preprocess_observation(preprocess_observation(random_frames()).transpose(1, 2, 0))


@pytest.mark.parametrize(
    "shape",
    [(96, 96), (96, 96, 4), (84, 96, 3), (96, 84, 3), (3, 96, 96), (2, 3, 96, 96), (96 * 96 * 3,), (5, 96, 96, 1)],
)
def test_wrong_shape_raises_value_error_with_the_shape(shape):
    with pytest.raises(ValueError) as error:
        preprocess_observation(np.zeros(shape, dtype=np.uint8))
    assert str(shape) in str(error.value)


def test_accepts_list_input_converted_to_uint8_array():
    frame = random_frames(seed=4)
    np.testing.assert_array_equal(preprocess_observation(list(frame)), preprocess_observation(frame))


@settings(max_examples=25)
@given(
    hnp.arrays(
        dtype=np.uint8,
        shape=st.tuples(st.integers(1, 2), st.just(96), st.just(96), st.just(3)),
        elements=st.integers(0, 255),
    )
)
def test_output_is_input_over_255_and_in_unit_interval(frames):
    out = preprocess_observation(frames)
    assert out.shape == (frames.shape[0], 3, 84, 96)
    assert out.min() >= 0.0 and out.max() <= 1.0
    np.testing.assert_array_equal(np.rint(out * 255).astype(np.uint8), np.moveaxis(frames[:, :84], -1, -3))
