"""Colour presets (envs/colours.py) and the track-preserving colour recipe (envs/car_racing.py)."""

from __future__ import annotations

import colorsys
import json

import gymnasium as gym
import numpy as np
import pytest

from nsacdrive.envs import make_car_racing
from nsacdrive.envs.colours import (
    DEFAULT_SCHEME,
    MAX_SHIFT_SEVERITY,
    ColourScheme,
    list_presets,
    resolve_colour_scheme,
    validate_preset,
)

SHIFTS = [f"shift-{k}" for k in range(1, MAX_SHIFT_SEVERITY + 1)]
NON_DEFAULT = ["shift-1", "shift-3", "shift-5", "random", "random-7", "color-v0"]


def rgb(scheme: ColourScheme) -> dict[str, np.ndarray]:
    return {name: np.array(getattr(scheme, name)) for name in ("road", "background", "grass")}


def hsv(colour) -> tuple[float, float, float]:
    return colorsys.rgb_to_hsv(*(np.asarray(colour, dtype=float) / 255.0))


# --------------------------------------------------------------------------- presets


def test_list_presets():
    assert list_presets() == ["default", *SHIFTS, "random", "random-N", "color-v0"]


def test_default_scheme_is_stock_carracing_colours():
    scheme = resolve_colour_scheme("default", track_seed=123)
    assert scheme is DEFAULT_SCHEME
    assert scheme.road == (102.0, 102.0, 102.0)
    assert scheme.background == (102.0, 204.0, 102.0)
    assert scheme.grass == (102.0, 230.0, 102.0)
    assert scheme.name == "default"


@pytest.mark.parametrize("severity", range(1, MAX_SHIFT_SEVERITY + 1))
def test_shift_rotates_hue_by_30_degrees_per_step_and_darkens_road(severity):
    scheme = resolve_colour_scheme(f"shift-{severity}", track_seed=0)
    assert scheme.name == f"shift-{severity}"
    np.testing.assert_allclose(scheme.road, [102.0 * (1 - 0.08 * severity)] * 3)
    for field in ("background", "grass"):
        h0, s0, v0 = hsv(getattr(DEFAULT_SCHEME, field))
        h, s, v = hsv(getattr(scheme, field))
        assert s == pytest.approx(s0, abs=1e-9)  # saturation and value are kept
        assert v == pytest.approx(v0, abs=1e-9)
        turn = abs(h - h0) * 360.0
        assert min(turn, 360.0 - turn) == pytest.approx(30.0 * severity, abs=1e-6)


def test_shift_3_concrete_values():
    scheme = resolve_colour_scheme("shift-3", track_seed=0)
    np.testing.assert_allclose(scheme.road, [77.52] * 3)
    # a quarter turn of hue keeps one channel at 102 and moves the other two
    assert sorted(np.round(scheme.background, 6)) == [102.0, 153.0, 204.0]
    assert sorted(np.round(scheme.grass, 6)) == [102.0, 166.0, 230.0]


@pytest.mark.parametrize("field", ["road", "background", "grass"])
def test_shift_severities_are_graded(field):
    default = np.array(getattr(DEFAULT_SCHEME, field))
    distances = [
        np.linalg.norm(np.array(getattr(resolve_colour_scheme(p, 0), field)) - default) for p in SHIFTS
    ]
    assert distances[0] > 0
    assert all(a < b for a, b in zip(distances, distances[1:])), distances


@pytest.mark.parametrize("preset", ["default", *SHIFTS, "random", "random-7", "random-0", "color-v0"])
@pytest.mark.parametrize("seed", [0, 42, 2**31 - 2])
def test_presets_are_deterministic_per_preset_and_seed(preset, seed):
    assert resolve_colour_scheme(preset, seed) == resolve_colour_scheme(preset, seed)


def test_random_varies_with_seed_and_follows_domain_randomize_distribution():
    schemes = [resolve_colour_scheme("random", seed) for seed in range(30)]
    assert len({(s.road, s.background, s.grass) for s in schemes}) == 30
    for scheme in schemes:
        assert scheme.name == "random"
        colours = rgb(scheme)
        assert np.all((colours["road"] >= 0) & (colours["road"] <= 210))
        assert np.all((colours["background"] >= 0) & (colours["background"] <= 210))
        difference = colours["grass"] - colours["background"]
        assert sorted(np.round(difference, 9)) == [0.0, 0.0, 20.0]  # +20 in exactly one channel


def test_random_n_is_one_scheme_for_every_track():
    fixed = resolve_colour_scheme("random-7", 0)
    assert fixed.name == "random-7"
    for seed in (1, 42, 999, 2**31 - 2):
        assert resolve_colour_scheme("random-7", seed) == fixed
    assert resolve_colour_scheme("random-8", 0) != fixed
    # and it is not the per-track stream of seed 7
    assert resolve_colour_scheme("random", 7).road != fixed.road


def test_color_v0_is_bounded_noise_around_default_shared_by_grass_and_background():
    schemes = [resolve_colour_scheme("color-v0", seed) for seed in range(30)]
    assert len({s.road for s in schemes}) == 30
    bound = 0.2 * 255 + 1e-9
    for scheme in schemes:
        assert scheme.name == "color-v0"
        colours = rgb(scheme)
        for field, value in colours.items():
            assert np.all((value >= 0) & (value <= 255))
            assert np.all(np.abs(value - np.array(getattr(DEFAULT_SCHEME, field))) <= bound)
        # background and grass get the same noise: where grass is not clipped at 255 the patches
        # keep their offset from the background
        background_noise = colours["background"] - np.array(DEFAULT_SCHEME.background)
        grass_noise = colours["grass"] - np.array(DEFAULT_SCHEME.grass)
        unclipped = colours["grass"] < 255
        np.testing.assert_allclose(grass_noise[unclipped], background_noise[unclipped], atol=1e-9)


@pytest.mark.parametrize(
    "name", ["", "Default", "shift-0", "shift-6", "shift-x", "random-", "random--1", "random-1.5", "color-v1", "blue"]
)
def test_invalid_preset_names_raise_value_error_listing_valid_names(name):
    with pytest.raises(ValueError) as error:
        resolve_colour_scheme(name, track_seed=0)
    message = str(error.value)
    assert repr(name) in message
    for valid in list_presets():
        assert valid in message
    with pytest.raises(ValueError):
        validate_preset(name)


def test_validate_preset_returns_valid_names():
    for name in ["default", *SHIFTS, "random", "random-12", "color-v0"]:
        assert validate_preset(name) == name


def test_env_rejects_invalid_preset():
    with pytest.raises(ValueError, match="unknown colour preset 'sepia'"):
        make_car_racing(colour_preset="sepia")


# --------------------------------------------------------------------------- ColourScheme


def test_colour_scheme_validation():
    with pytest.raises(ValueError, match="road"):
        ColourScheme(road=(0.0, 0.0), background=(0.0, 0.0, 0.0), grass=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match=r"background must lie in \[0, 255\]"):
        ColourScheme(road=(0.0, 0.0, 0.0), background=(0.0, 256.0, 0.0), grass=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="grass"):
        ColourScheme(road=(0.0, 0.0, 0.0), background=(0.0, 0.0, 0.0), grass=(0.0, -1.0, 0.0))
    with pytest.raises(ValueError, match="finite"):
        ColourScheme(road=(np.nan, 0.0, 0.0), background=(0.0, 0.0, 0.0), grass=(0.0, 0.0, 0.0))


@pytest.mark.parametrize("preset", ["default", "shift-2", "random", "color-v0"])
def test_colour_scheme_dict_round_trip_is_json_ready(preset):
    scheme = resolve_colour_scheme(preset, 5)
    data = json.loads(json.dumps(scheme.to_dict()))
    assert data["name"] == preset
    assert ColourScheme.from_dict(data) == scheme


# --------------------------------------------------------------------------- track-preserving recipe in the env


def track_array(env) -> np.ndarray:
    return np.array(env.unwrapped.track)


def test_default_env_track_of_seed_42_is_stock_gymnasium_track():
    env = make_car_racing(render_observations=False)
    _, info = env.reset(seed=42)
    assert info["n_tiles"] == 283
    assert len(env.unwrapped.track) == 283
    stock = gym.make("CarRacing-v3")
    stock.reset(seed=42)
    np.testing.assert_array_equal(track_array(env), track_array(stock))
    stock.close()
    env.close()


@pytest.mark.parametrize("preset", ["shift-3", "random", "random-7", "color-v0"])
def test_colour_presets_keep_the_default_track(preset):
    default_env = make_car_racing(render_observations=False)
    painted_env = make_car_racing(colour_preset=preset, render_observations=False)
    for seed in (42, 0, 7, 1234):
        _, default_info = default_env.reset(seed=seed)
        _, info = painted_env.reset(seed=seed)
        np.testing.assert_array_equal(track_array(painted_env), track_array(default_env))
        assert info["n_tiles"] == default_info["n_tiles"]
        if seed == 42:
            assert info["n_tiles"] == 283
    default_env.close()
    painted_env.close()


@pytest.mark.parametrize("preset", NON_DEFAULT)
def test_env_paints_with_the_resolved_scheme_and_frames_differ_from_default(preset):
    seed = 42
    expected = resolve_colour_scheme(preset, seed)
    env = make_car_racing(colour_preset=preset)
    frame, info = env.reset(seed=seed)
    base = env.unwrapped
    np.testing.assert_array_equal(base.road_color, expected.road)
    np.testing.assert_array_equal(base.bg_color, expected.background)
    np.testing.assert_array_equal(base.grass_color, expected.grass)
    assert base.colour_scheme == expected
    assert info["colour_scheme"] == expected.to_dict()

    default_env = make_car_racing()
    default_frame, _ = default_env.reset(seed=seed)
    assert frame.shape == default_frame.shape == (96, 96, 3)
    assert not np.array_equal(frame, default_frame)
    # the scene (above the HUD) is recoloured, not just the HUD
    assert np.mean(np.any(frame[:84] != default_frame[:84], axis=-1)) > 0.1
    env.close()
    default_env.close()


@pytest.mark.parametrize("preset", ["default", "shift-4", "random", "color-v0"])
def test_first_frame_is_dominated_by_the_scheme_background(preset):
    seed = 3
    env = make_car_racing(colour_preset=preset)
    frame, _ = env.reset(seed=seed)
    scene = frame[:84].reshape(-1, 3).astype(int)
    coloured = scene[np.any(scene != 0, axis=1)]  # the zoomed-out first frame has black margins
    colours, counts = np.unique(coloured, axis=0, return_counts=True)
    dominant = colours[np.argmax(counts)]
    # smoothscaling/antialiasing shifts flat areas by a couple of levels
    np.testing.assert_allclose(dominant, resolve_colour_scheme(preset, seed).background, atol=4)
    env.close()
