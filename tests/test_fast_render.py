"""The fast state renderer against gymnasium's stock renderer, on identical env states."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.envs.box2d.car_dynamics import Car
from gymnasium.envs.box2d.car_racing import CarRacing

from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.rollout import drive
from nsacdrive.envs import make_car_racing
from nsacdrive.envs.fast_render import FastStateRenderer, smoothscale_lut

# Issue tolerances: mean |diff| <= 3/255 overall, 99th percentile of per-frame means <= 6/255.
# The renderer does far better (~0.4); the regression bound below catches a real slip early.
MAX_FRAME_MAE = 6.0
MAX_MEAN_MAE = 1.0


def stock_frame(env) -> np.ndarray:
    return CarRacing._render(env.unwrapped, "state_pixels")


def sampled_pairs(seed: int, preset: str, steps: tuple[int, ...], horizon: int = 200):
    """(step, fast, stock) frames of the SAME env state at the given steps of an expert drive."""
    env = make_car_racing(colour_preset=preset, render_observations=False, renderer="fast", max_episode_steps=horizon)
    out = []
    for t, _ in enumerate(drive(env, PurePursuitExpert(), seed=seed)):
        if t in steps:
            out.append((t, env.unwrapped.render_observation(), stock_frame(env)))
    env.close()
    return out


@pytest.fixture(scope="module")
def frame_pairs():
    cases = [(0, "default"), (7, "shift-3"), (11, "random"), (13, "color-v0")]
    steps = (0, 10, 25, 45, 60, 90, 130, 170, 199)  # zoom-in (t < 1 s) included
    return [pair for seed, preset in cases for pair in sampled_pairs(seed, preset, steps)]


def test_pixels_agree_with_stock_within_tolerance(frame_pairs):
    maes = np.array([np.abs(fast.astype(float) - stock.astype(float)).mean() for _, fast, stock in frame_pairs])
    assert len(maes) == 36
    assert maes.max() <= MAX_FRAME_MAE
    assert maes.mean() <= MAX_MEAN_MAE


def test_zoom_in_frames_agree(frame_pairs):
    intro = [(f, s) for t, f, s in frame_pairs if t < 50]
    assert intro
    for fast, stock in intro:
        assert np.abs(fast.astype(float) - stock.astype(float)).mean() <= MAX_FRAME_MAE


def test_hud_region_agrees(frame_pairs):
    """Speed/ABS/steering/gyro bars and the score digits sit in rows 84..95."""
    hud = np.array([np.abs(f[84:].astype(float) - s[84:].astype(float)).mean() for _, f, s in frame_pairs])
    assert hud.mean() <= 3.0


def car_mask(frame: np.ndarray) -> np.ndarray:
    """Pixels dominated by the hull's red (204, 0, 0); the HUD rows are excluded."""
    rgb = frame[:84].astype(int)
    return (rgb[..., 0] > 120) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)


def mask_pose(mask: np.ndarray) -> tuple[np.ndarray, float]:
    rows, cols = np.nonzero(mask)
    centre = np.array([rows.mean(), cols.mean()])
    cov = np.cov(np.stack([rows, cols]))
    eigenvalues, eigenvectors = np.linalg.eigh(cov)
    major = eigenvectors[:, np.argmax(eigenvalues)]
    return centre, float(np.arctan2(major[0], major[1]) % np.pi)


def test_car_drawn_at_the_same_place_and_heading():
    """Driving with steering so the car turns relative to the track; the camera keeps it upright."""
    env = make_car_racing(render_observations=False, renderer="fast", max_episode_steps=200)
    env.reset(seed=3)
    for t in range(120):
        env.step(np.array([0.6 if t > 60 else 0.0, 0.4, 0.0], dtype=np.float32))
    fast, stock = env.unwrapped.render_observation(), stock_frame(env)
    fast_mask, stock_mask = car_mask(fast), car_mask(stock)
    assert stock_mask.sum() >= 6
    iou = (fast_mask & stock_mask).sum() / (fast_mask | stock_mask).sum()
    assert iou >= 0.6
    (fast_centre, fast_axis), (stock_centre, stock_axis) = mask_pose(fast_mask), mask_pose(stock_mask)
    assert np.linalg.norm(fast_centre - stock_centre) < 0.75
    assert abs(fast_axis - stock_axis) < 0.3


def test_a_new_car_at_a_freed_cars_address_is_drawn_anew():
    """The renderer caches the car's bodies; a new car can be allocated where the old, freed one lay,
    so the cache must not key on ``id()`` (it would draw the old car's bodies)."""
    env = make_car_racing(render_observations=False, renderer="fast", max_episode_steps=200)
    env.reset(seed=3)
    base = env.unwrapped
    for _ in range(60):  # past the zoom-in
        env.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))
    base.render_observation()  # this car's bodies cached
    angle, (x, y) = base.car.hull.angle, base.car.hull.position
    base.car.destroy()
    base.car = None  # the old car's last reference unless the renderer keeps one
    base.car = Car(base.world, angle + 0.5, x + 3.0, y)  # typically takes the freed car's place
    np.testing.assert_array_equal(base.render_observation(), FastStateRenderer().render(base))


def test_colour_presets_are_honoured():
    frames = {}
    for preset in ("default", "shift-4"):
        env = make_car_racing(colour_preset=preset, renderer="fast")
        frames[preset], _ = env.reset(seed=5)
        for _ in range(60):
            frames[preset], *_ = env.step(np.array([0.0, 0.0, 0.0], dtype=np.float32))
        scheme = env.unwrapped.colour_scheme
        # The car sits on the road: the road colour (after smoothscale's darkening) is in the frame.
        road = smoothscale_lut()[np.array(scheme.road).astype(int)]
        assert (np.abs(frames[preset][:84].astype(int) - road).max(axis=-1) <= 2).sum() > 200
        env.close()
    assert np.abs(frames["default"].astype(int) - frames["shift-4"].astype(int)).mean() > 10


def test_same_seed_and_actions_give_identical_frames():
    runs = []
    for _ in range(2):
        env = make_car_racing(renderer="fast", max_episode_steps=200)
        frames = [env.reset(seed=9)[0]]
        rng = np.random.default_rng(0)
        for _ in range(80):
            frames.append(env.step(np.array([rng.uniform(-1, 1), 0.5, 0.0], dtype=np.float32))[0])
        runs.append(np.stack(frames))
        env.close()
    np.testing.assert_array_equal(runs[0], runs[1])


def test_fast_path_never_calls_the_stock_state_renderer(monkeypatch):
    def forbidden(self, mode):
        raise AssertionError(f"stock _render({mode!r}) called")

    monkeypatch.setattr(CarRacing, "_render", forbidden)
    env = make_car_racing(renderer="fast")
    observation, _ = env.reset(seed=1)
    observation, *_ = env.step(np.array([0.0, 1.0, 0.0], dtype=np.float32))
    assert observation.shape == (96, 96, 3) and observation.dtype == np.uint8
    assert observation.std() > 5
    renderer = env.unwrapped._fast_renderer
    assert (renderer.height, renderer.width) == (384, 384)  # never the 800×1000 canvas
    env.close()


def test_rgb_array_mode_still_uses_stock_video_frames():
    env = make_car_racing(renderer="fast", render_mode="rgb_array")
    env.reset(seed=2)
    frame = env.render()
    assert frame.shape == (400, 600, 3)
    env.close()


def test_renderer_argument_is_validated():
    with pytest.raises(ValueError, match="renderer must be one of"):
        make_car_racing(renderer="opengl")
    with pytest.raises(ValueError, match="supersample"):
        FastStateRenderer(supersample=0)


def test_smoothscale_lut_matches_pygame_on_flat_levels():
    import pygame

    lut = smoothscale_lut()
    for level in (0, 37, 102, 230, 255):
        surface = pygame.Surface((1000, 800))
        surface.fill((level, level, level))
        scaled = pygame.surfarray.array3d(pygame.transform.smoothscale(surface, (96, 96)))
        assert np.all(scaled == lut[level])


def test_human_mode_still_renders_a_window_with_the_fast_renderer():
    env = make_car_racing(renderer="fast", render_mode="human")  # SDL dummy video driver in tests
    observation, _ = env.reset(seed=2)
    observation, *_ = env.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))
    assert env.unwrapped.screen is not None and env.unwrapped.screen.get_size() == (1000, 800)
    assert observation.shape == (96, 96, 3) and observation.std() > 5
    env.close()


def test_the_hud_font_survives_a_closed_window_env():
    """A human-mode env's close() calls pygame.quit(), which invalidates fonts made before it."""
    shown = make_car_racing(renderer="fast", render_mode="human")
    shown.reset(seed=2)
    shown.unwrapped.reward = 1234.0  # a score string no renderer has cached yet
    shown.unwrapped.render_observation()
    shown.close()
    env = make_car_racing(renderer="fast")
    env.reset(seed=2)
    env.unwrapped.reward = 4321.0
    frame = env.unwrapped.render_observation()
    assert frame[86:93, 1:11].max() > 100  # the digits are drawn
    env.close()
