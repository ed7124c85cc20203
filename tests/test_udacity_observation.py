"""Udacity preprocessing (crop, AREA resize, YUV, [−1, 1]), the observation-kind dispatch, and the
training augmentation's label maths (camera ±0.2, flip, 0.002/px, brightness without wrap-round)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nsacdrive.controllers.udacity_augment import (
    UdacityAugmentConfig,
    augment_sequence,
    mirror,
    scale_brightness,
    shadow,
    translate,
)
from nsacdrive.envs.observation import preprocess_observation
from nsacdrive.envs.observation_kinds import OBSERVATION_KINDS, observation_kind, preprocess_for
from nsacdrive.envs.udacity_observation import (
    UDACITY_CROP_ROWS,
    UDACITY_FRAME_SHAPE,
    UDACITY_RAW_FRAME_SHAPE,
    encode_udacity,
    preprocess_udacity,
)


def textured(*batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(*batch, 160, 320, 3), dtype=np.uint8)


def reference(frame: np.ndarray) -> np.ndarray:
    """The docs/driving.md#udacity-preprocessing recipe written out with cv2, independently of the module."""
    resized = cv2.resize(frame[60:135], (200, 66), interpolation=cv2.INTER_AREA)
    return np.transpose(cv2.cvtColor(resized, cv2.COLOR_RGB2YUV), (2, 0, 1)).astype(np.float32) / 127.5 - 1


# --------------------------------------------------------------------------- preprocessing


def test_constants():
    assert UDACITY_RAW_FRAME_SHAPE == (160, 320, 3)
    assert UDACITY_FRAME_SHAPE == (3, 66, 200)


@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_shapes_and_dtype_over_batch_dims(batch):
    out = preprocess_udacity(textured(*batch))
    assert out.shape == (*batch, 3, 66, 200)
    assert out.dtype == np.float32
    assert out.min() >= -1.0 and out.max() <= 1.0


def test_constant_colour_gives_known_yuv_values():
    frame = np.empty((160, 320, 3), dtype=np.uint8)
    frame[:] = (100, 150, 200)
    out = preprocess_udacity(frame)
    # Y = .299R + .587G + .114B = 140.75; U = .492(B − Y) + 128 = 157.15; V = .877(R − Y) + 128 = 92.26
    for channel, level in enumerate((141, 157, 92)):
        np.testing.assert_array_equal(out[channel], np.float32(level) / np.float32(127.5) - np.float32(1))
    np.testing.assert_allclose(out[:, 0, 0], [0.105882, 0.231373, -0.278431], atol=1e-6)


def test_extremes_map_to_minus_one_and_one():
    black = preprocess_udacity(np.zeros((160, 320, 3), dtype=np.uint8))
    white = preprocess_udacity(np.full((160, 320, 3), 255, dtype=np.uint8))
    np.testing.assert_array_equal(black[0], -1.0)
    np.testing.assert_array_equal(white[0], 1.0)
    np.testing.assert_allclose(black[1:], 128 / 127.5 - 1, atol=1e-7)  # grey has no chroma: U = V = 128


def test_matches_the_cv2_reference_with_area_interpolation():
    frame = textured(seed=3)
    out = preprocess_udacity(frame)
    np.testing.assert_array_equal(out, reference(frame))
    # the classic script's positional flag lands in `dst` and silently resizes bilinearly
    buggy = cv2.resize(frame[60:135], (200, 66), cv2.INTER_AREA)
    linear = cv2.resize(frame[60:135], (200, 66), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(buggy, linear)
    assert not np.array_equal(cv2.cvtColor(buggy, cv2.COLOR_RGB2YUV), np.transpose((out + 1) * 127.5, (1, 2, 0)).round())


def test_rows_outside_the_crop_are_ignored_and_rows_inside_are_not():
    frame = textured(seed=1)
    changed = frame.copy()
    changed[:60] = 0
    changed[135:] = 255
    np.testing.assert_array_equal(preprocess_udacity(frame), preprocess_udacity(changed))
    changed[60] = 255 - changed[60]
    assert not np.array_equal(preprocess_udacity(frame), preprocess_udacity(changed))


def test_batch_equals_frame_by_frame():
    frames = textured(2, 3, seed=4)
    out = preprocess_udacity(frames)
    for i in range(2):
        for t in range(3):
            np.testing.assert_array_equal(out[i, t], preprocess_udacity(frames[i, t]))


@pytest.mark.parametrize("bad, error", [
    (np.zeros((160, 320, 3), dtype=np.float32), TypeError),
    (np.zeros((96, 96, 3), dtype=np.uint8), ValueError),
    (np.zeros((320, 160, 3), dtype=np.uint8), ValueError),
])
def test_rejects_wrong_dtype_and_shape(bad, error):
    with pytest.raises(error, match="preprocess_udacity expects"):
        preprocess_udacity(bad)


# --------------------------------------------------------------------------- dispatch


def test_dispatch_by_kind():
    assert preprocess_for("udacity") is preprocess_udacity
    assert preprocess_for("carracing") is preprocess_observation
    assert observation_kind("udacity").raw_shape == (160, 320, 3)
    assert observation_kind("carracing").frame_shape == (3, 84, 96)
    assert set(OBSERVATION_KINDS) == {"carracing", "udacity"}
    with pytest.raises(ValueError, match="model config 'observation': unknown observation kind 'carla'"):
        observation_kind("carla", "model config 'observation'")


# --------------------------------------------------------------------------- augmentation


class ScriptedRng:
    """Stands in for np.random.Generator with scripted draws: ``apply`` lists, per step (camera,
    flip, translate, shadow, brightness), whether it fires; the other values are given."""

    def __init__(self, apply: tuple[bool, ...], camera: int = 0, uniforms: tuple[float, ...] = ()) -> None:
        self.randoms = [0.0 if a else 0.99 for a in apply]
        self.camera = camera
        self.uniforms = list(uniforms)

    def random(self) -> float:
        return self.randoms.pop(0)

    def integers(self, n: int) -> int:
        assert self.camera < n
        return self.camera

    def uniform(self, low, high, size=None):
        if size is not None:
            return np.array([self.uniforms.pop(0) for _ in range(size)])
        return self.uniforms.pop(0)


def cameras(length: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, 256, size=(length, 160, 320, 3), dtype=np.uint8) for name in ("center", "left", "right")}


ACTIONS = np.array([[0.1, 0.5, 0.0], [-0.3, 0.7, 0.2]], dtype=np.float32)
CONFIG = UdacityAugmentConfig(probability=0.6)


def test_no_step_fires_returns_the_centre_frames_and_labels():
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, rng=ScriptedRng((False,) * 5))
    np.testing.assert_array_equal(frames, cams["center"])
    np.testing.assert_array_equal(labels, ACTIONS)


@pytest.mark.parametrize("camera, index, offset", [("center", 0, 0.0), ("left", 1, 0.2), ("right", 2, -0.2)])
def test_camera_choice_shifts_steering(camera, index, offset):
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, rng=ScriptedRng((True, False, False, False, False), camera=index))
    np.testing.assert_array_equal(frames, cams[camera])
    np.testing.assert_allclose(labels[:, 0], ACTIONS[:, 0] + offset, atol=1e-7)
    np.testing.assert_array_equal(labels[:, 1:], ACTIONS[:, 1:])  # throttle and brake never change


SIDE_ACTIONS = {"left": np.array([[0.4, 0.3, 0.0], [0.2, 0.6, 0.0]], dtype=np.float32),
                "right": np.array([[-0.5, 0.2, 0.1], [-0.6, 0.1, 0.3]], dtype=np.float32)}


@pytest.mark.parametrize("camera, index", [("left", 1), ("right", 2)])
def test_a_side_camera_with_its_own_labels_takes_them_whole(camera, index):
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, camera_actions=SIDE_ACTIONS,
                                      rng=ScriptedRng((True, False, False, False, False), camera=index))
    np.testing.assert_array_equal(frames, cams[camera])
    np.testing.assert_array_equal(labels, SIDE_ACTIONS[camera])  # steering and pedals, no fixed offset


def test_side_camera_labels_follow_the_flip_and_leave_the_centre_alone():
    cams = cameras()
    _, flipped = augment_sequence(cams, ACTIONS, config=CONFIG, camera_actions=SIDE_ACTIONS,
                                  rng=ScriptedRng((True, True, False, False, False), camera=1))
    np.testing.assert_array_equal(flipped[:, 0], -SIDE_ACTIONS["left"][:, 0])
    np.testing.assert_array_equal(flipped[:, 1:], SIDE_ACTIONS["left"][:, 1:])
    _, centre = augment_sequence(cams, ACTIONS, config=CONFIG, camera_actions=SIDE_ACTIONS,
                                 rng=ScriptedRng((True, False, False, False, False), camera=0))
    np.testing.assert_array_equal(centre, ACTIONS)


def test_a_side_camera_without_its_own_labels_keeps_the_fixed_correction():
    _, labels = augment_sequence(cameras(), ACTIONS, config=CONFIG, camera_actions={"left": SIDE_ACTIONS["left"]},
                                 rng=ScriptedRng((True, False, False, False, False), camera=2))
    np.testing.assert_allclose(labels[:, 0], ACTIONS[:, 0] - 0.2, atol=1e-7)


def test_camera_choice_without_side_cameras_keeps_the_centre():
    cams = {"center": cameras()["center"]}
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, rng=ScriptedRng((True, False, False, False, False), camera=0))
    np.testing.assert_array_equal(frames, cams["center"])
    np.testing.assert_array_equal(labels, ACTIONS)


def test_flip_mirrors_frames_and_negates_steering():
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, rng=ScriptedRng((False, True, False, False, False)))
    np.testing.assert_array_equal(frames, cams["center"][:, :, ::-1])
    np.testing.assert_allclose(labels[:, 0], -ACTIONS[:, 0])


@pytest.mark.parametrize("tx", [10.0, -25.0])
def test_translation_adds_0_002_per_pixel(tx):
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, config=CONFIG, rng=ScriptedRng((False, False, True, False, False), uniforms=(tx, 0.0)))
    np.testing.assert_allclose(labels[:, 0], ACTIONS[:, 0] + 0.002 * tx, atol=1e-7)
    shift = int(tx)
    if shift > 0:
        np.testing.assert_array_equal(frames[:, :, shift:], cams["center"][:, :, :-shift])
        assert not frames[:, :, :shift].any()  # black border
    else:
        np.testing.assert_array_equal(frames[:, :, :shift], cams["center"][:, :, -shift:])
        assert not frames[:, :, shift:].any()


def test_vertical_translation_moves_rows_and_leaves_steering():
    shifted = translate(cameras()["center"], 0.0, 3.0)
    np.testing.assert_array_equal(shifted[:, 3:], cameras()["center"][:, :-3])
    _, labels = augment_sequence(cameras(), ACTIONS, config=CONFIG, rng=ScriptedRng((False, False, True, False, False), uniforms=(0.0, 3.0)))
    np.testing.assert_allclose(labels, ACTIONS)


def test_steps_compose_in_order_and_clip_to_the_action_box():
    # right camera (−0.2), flip (negate), then +0.002·40: −(0.1 − 0.2) + 0.08 = 0.18; −(−0.3 − 0.2) + 0.08 = 0.58
    rng = ScriptedRng((True, True, True, False, False), camera=2, uniforms=(40.0, 0.0))
    _, labels = augment_sequence(cameras(), ACTIONS, rng, CONFIG)
    np.testing.assert_allclose(labels[:, 0], [0.18, 0.58], atol=1e-6)
    extreme = np.array([[0.95, 0.0, 0.0], [-0.9, 0.0, 0.0]], dtype=np.float32)
    _, labels = augment_sequence(cameras(), extreme, config=CONFIG, rng=ScriptedRng((True, False, True, False, False), camera=1,
                                                                         uniforms=(50.0, 0.0)))
    np.testing.assert_allclose(labels[:, 0], [1.0, -0.9 + 0.2 + 0.1], atol=1e-6)


def test_shadow_darkens_one_side_only():
    frames = np.full((1, 160, 320, 3), 200, dtype=np.uint8)
    out = shadow(frames, top_x=100.0, bottom_x=100.0, left_side=True, lightness=0.5)
    assert (out[0, :, :100] < 150).all()  # lightness halved on the left of x = 100
    np.testing.assert_array_equal(out[0, :, 100:], 200)


def shadow_by_hand(frames, top_x, bottom_x, left_side, lightness):
    """The shadow written out pixel by pixel: HLS lightness × ``lightness``, truncated, on one side of the line."""
    out = frames.copy()
    for frame in out:
        hls = cv2.cvtColor(frame, cv2.COLOR_RGB2HLS)
        for y in range(frame.shape[0]):
            line_x = top_x + (bottom_x - top_x) * y / frame.shape[0]
            columns = np.arange(frame.shape[1])
            side = columns < line_x if left_side else columns >= line_x
            hls[y, side, 1] = (hls[y, side, 1] * lightness).astype(np.uint8)
        frame[:] = cv2.cvtColor(hls, cv2.COLOR_HLS2RGB)
    return out


@pytest.mark.parametrize("top_x, bottom_x, left_side, lightness", [(100.0, 220.5, True, 0.37), (300.0, 10.0, False, 0.2)])
def test_shadow_equals_the_pixel_by_pixel_recipe(top_x, bottom_x, left_side, lightness):
    frames = textured(2, seed=3)
    np.testing.assert_array_equal(shadow(frames, top_x, bottom_x, left_side, lightness),
                                  shadow_by_hand(frames, top_x, bottom_x, left_side, lightness))


def test_per_pixel_steps_in_kept_rows_only_equal_the_whole_frame_there():
    frames = textured(3, seed=4)
    rows = UDACITY_CROP_ROWS
    for whole, kept in ((shadow(frames, 40.0, 290.0, True, 0.3), shadow(frames, 40.0, 290.0, True, 0.3, rows)),
                        (scale_brightness(frames, 1.17), scale_brightness(frames, 1.17, rows))):
        np.testing.assert_array_equal(kept[:, rows], whole[:, rows])
        np.testing.assert_array_equal(kept[:, :rows.start], frames[:, :rows.start])  # the others untouched
        np.testing.assert_array_equal(kept[:, rows.stop:], frames[:, rows.stop:])


def test_kept_rows_must_be_one_block():
    stepped = slice(60, 135, 2)
    with pytest.raises(ValueError, match="udacity_augment rows must be a slice without a step"):
        shadow(textured(1), 10.0, 20.0, True, 0.5, stepped)
    with pytest.raises(ValueError, match="udacity_augment rows must be a slice without a step"):
        scale_brightness(textured(1), 1.1, stepped)


def test_the_trainers_kept_rows_give_the_network_the_same_frames():
    """``rows=UDACITY_CROP_ROWS`` (what the trainer passes) changes nothing the network sees."""
    cams, config = cameras(length=3, seed=6), UdacityAugmentConfig(probability=0.8)
    for seed in range(12):
        whole, labels = augment_sequence(cams, ACTIONS[[0, 1, 0]], np.random.default_rng(seed), config)
        kept, kept_labels = augment_sequence(cams, ACTIONS[[0, 1, 0]], np.random.default_rng(seed), config, rows=UDACITY_CROP_ROWS)
        np.testing.assert_array_equal(encode_udacity(kept), encode_udacity(whole))
        np.testing.assert_array_equal(kept_labels, labels)


def test_a_zero_shift_is_the_identity_and_mirror_is_the_reversed_view():
    """Why the augmentation skips a zero translation, and what ``mirror`` must equal."""
    frames = textured(2, seed=7)
    np.testing.assert_array_equal(translate(frames, 0.0, 0.0), frames)
    np.testing.assert_array_equal(mirror(frames), frames[:, :, ::-1])
    np.testing.assert_array_equal(mirror(frames[::2]), frames[::2, :, ::-1])  # a strided view, as the dataset passes


def test_brightness_is_clipped_before_the_cast():
    frames = np.array([[[[250, 128, 0]]]], dtype=np.uint8)
    np.testing.assert_array_equal(scale_brightness(frames, 1.2), [[[[255, 154, 0]]]])  # 250 × 1.2 = 300 → 255, not 44
    np.testing.assert_array_equal(scale_brightness(frames, 0.8), [[[[200, 102, 0]]]])


@given(hnp.arrays(np.uint8, (3, 4, 3)), st.floats(0.8, 1.2))
def test_brightness_never_wraps(frames, factor):
    out = scale_brightness(frames, factor)
    assert out.dtype == np.uint8
    expected = np.clip(np.rint(frames.astype(np.float32) * np.float32(factor)), 0, 255)
    np.testing.assert_array_equal(out, expected)
    if factor >= 1:
        assert (out >= frames).all()  # brighter never turns a pixel darker (what wrap-round does)
    else:
        assert (out <= frames).all()


def test_same_generator_seed_gives_the_same_sequence():
    cams = cameras(seed=5)
    a = augment_sequence(cams, ACTIONS, np.random.default_rng(7), UdacityAugmentConfig(probability=1.0))
    b = augment_sequence(cams, ACTIONS, np.random.default_rng(7), UdacityAugmentConfig(probability=1.0))
    c = augment_sequence(cams, ACTIONS, np.random.default_rng(8), UdacityAugmentConfig(probability=1.0))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert a[0].dtype == np.uint8 and a[0].shape == (2, 160, 320, 3)


def test_probability_zero_is_the_identity():
    cams = cameras()
    frames, labels = augment_sequence(cams, ACTIONS, np.random.default_rng(0), UdacityAugmentConfig(probability=0.0))
    np.testing.assert_array_equal(frames, cams["center"])
    np.testing.assert_array_equal(labels, ACTIONS)


def test_each_step_fires_with_its_probability():
    rng = np.random.default_rng(0)
    flips = 0
    cams = {"center": np.arange(320, dtype=np.uint8)[None, None, :, None].repeat(160, 1).repeat(3, 3)}
    for _ in range(400):
        frames, _ = augment_sequence(cams, ACTIONS[:1], rng, UdacityAugmentConfig(probability=0.6, translate_x=0, translate_y=0,
                                                                                   shadow_lightness=(1.0, 1.0), brightness=(1.0, 1.0)))
        flips += int(frames[0, 80, 0, 0] == 63)  # column 319 (uint8 63) moved to column 0
    assert 0.53 < flips / 400 < 0.67


@pytest.mark.parametrize("field, value", [("probability", 1.5), ("translate_x", -1.0), ("brightness", (1.2, 0.8))])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"udacity_augment {field}"):
        UdacityAugmentConfig(**{field: value})
