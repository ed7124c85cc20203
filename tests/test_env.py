"""NsacCarRacing / make_car_racing, privileged_state and the PixelJitter wrapper."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from nsacdrive.envs import (
    ENV_ID,
    STATE_FIELDS,
    ColourScheme,
    NsacCarRacing,
    PixelJitter,
    PixelJitterConfig,
    make_car_racing,
    privileged_state,
    resolve_colour_scheme,
)
from nsacdrive.envs.geometry import wrap_angle


def action_sequence(n: int, seed: int = 0) -> list[np.ndarray]:
    """A varied but reproducible sequence: accelerate, then weave with some braking."""
    rng = np.random.default_rng(seed)
    actions = []
    for k in range(n):
        steer = 0.0 if k < 5 else float(rng.uniform(-1, 1))
        actions.append(np.array([steer, 0.8 if k < 10 else float(rng.uniform(0, 1)), 0.0 if k < 10 else 0.1], dtype=np.float32))
    return actions


# --------------------------------------------------------------------------- factory


def test_factory_wraps_time_limit_and_spaces():
    env = make_car_racing(max_episode_steps=7)
    assert isinstance(env.unwrapped, NsacCarRacing)
    assert env.spec.max_episode_steps == 7
    assert env.observation_space.shape == (96, 96, 3)
    assert env.observation_space.dtype == np.uint8
    np.testing.assert_array_equal(env.action_space.low, [-1, 0, 0])
    np.testing.assert_array_equal(env.action_space.high, [1, 1, 1])
    env.close()


@pytest.mark.parametrize("steps", [0, -5])
def test_factory_rejects_non_positive_horizon(steps):
    with pytest.raises(ValueError, match=f"max_episode_steps must be positive, got {steps}"):
        make_car_racing(max_episode_steps=steps)


def test_episode_truncates_exactly_at_horizon():
    env = make_car_racing(render_observations=False, max_episode_steps=5)
    env.reset(seed=0)
    flags = [env.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))[3] for _ in range(5)]
    assert flags == [False, False, False, False, True]
    env.close()


# --------------------------------------------------------------------------- info and seeding


def test_reset_info():
    env = make_car_racing(colour_preset="shift-2", render_observations=False)
    _, info = env.reset(seed=42)
    assert info["track_seed"] == 42 and type(info["track_seed"]) is int
    assert info["n_tiles"] == 283 == len(env.unwrapped.track)
    assert info["colour_scheme"] == resolve_colour_scheme("shift-2", 42).to_dict()
    assert env.unwrapped.track_seed == 42
    env.close()


def test_reset_without_seed_gives_integer_track_seed_and_fresh_tracks():
    env = make_car_racing(render_observations=False)
    seeds = []
    for _ in range(3):
        _, info = env.reset()
        assert type(info["track_seed"]) is int
        assert 0 <= info["track_seed"] < 2**31 - 1
        assert info["n_tiles"] == len(env.unwrapped.track) > 100
        seeds.append(info["track_seed"])
    assert len(set(seeds)) == 3
    env.close()


def test_unseeded_resets_are_reproducible_after_a_seeded_reset():
    runs = []
    for _ in range(2):
        env = make_car_racing(render_observations=False)
        env.reset(seed=5)
        _, first = env.reset()
        track = np.array(env.unwrapped.track)
        _, second = env.reset()
        runs.append((first["track_seed"], second["track_seed"], track))
        env.close()
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    np.testing.assert_array_equal(runs[0][2], runs[1][2])
    assert len({5, runs[0][0], runs[0][1]}) == 3
    # the recorded track_seed regenerates that exact episode
    env = make_car_racing(render_observations=False)
    env.reset(seed=runs[0][0])
    np.testing.assert_array_equal(np.array(env.unwrapped.track), runs[0][2])
    env.close()


def test_reset_options_override_colours_for_one_episode():
    env = make_car_racing(colour_preset="shift-1", render_observations=False)
    _, info = env.reset(seed=3, options={"colour_preset": "random-4"})
    assert info["colour_scheme"] == resolve_colour_scheme("random-4", 3).to_dict()
    custom = ColourScheme(road=(10.0, 20.0, 30.0), background=(40.0, 50.0, 60.0), grass=(70.0, 80.0, 90.0), name="mine")
    _, info = env.reset(seed=3, options={"colour_scheme": custom})
    assert info["colour_scheme"]["name"] == "mine"
    np.testing.assert_array_equal(env.unwrapped.bg_color, [40.0, 50.0, 60.0])
    _, info = env.reset(seed=3)  # back to the constructor's preset
    assert info["colour_scheme"]["name"] == "shift-1"
    with pytest.raises(TypeError, match="ColourScheme"):
        env.reset(seed=3, options={"colour_scheme": {"road": [0, 0, 0]}})
    env.close()


# --------------------------------------------------------------------------- render-free mode


def test_render_free_observations_are_zero_frames():
    env = make_car_racing(render_observations=False)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (96, 96, 3) and obs.dtype == np.uint8
    assert not obs.any()
    for action in action_sequence(5):
        obs, *_ = env.step(action)
        assert obs.shape == (96, 96, 3) and not obs.any()
    env.close()


@pytest.mark.parametrize("renderer", ["stock", "fast"])
def test_render_free_observations_pass_gymnasiums_checker(renderer):
    env = gym.make(ENV_ID, render_observations=False, renderer=renderer, max_episode_steps=50)
    check_env(env.unwrapped, skip_render_check=True)  # asserts that no two calls share observation data
    env.close()


def test_render_free_env_made_by_id_raises_no_passive_checker_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        env = gym.make(ENV_ID, render_observations=False, max_episode_steps=50)  # passive checker on
        env.reset(seed=0)
        for action in action_sequence(3):
            env.step(action)
        env.close()


def test_a_kept_render_free_observation_does_not_change_after_the_next_step():
    env = make_car_racing(render_observations=False)
    kept, _ = env.reset(seed=0)
    kept[:] = 7  # a user marks (or normalises in place) the frame they keep
    later, *_ = env.step(action_sequence(1)[0])
    again, *_ = env.step(action_sequence(1)[0])
    assert not later.any() and not again.any() and (kept == 7).all()
    assert not np.shares_memory(later, again)
    env.close()


SCORE_BOX = (slice(84, 96), slice(0, 12))  # HUD rows, where the stock renderer prints the score


def render_free_vs_rendering(seed: int, actions, check_steps):
    """Yield (step, render_observation() of a render-free env, frame of a rendering env)."""
    rendering = make_car_racing(render_observations=True)
    render_free = make_car_racing(render_observations=False)
    frame, _ = rendering.reset(seed=seed)
    render_free.reset(seed=seed)
    try:
        for k, action in enumerate([None, *actions]):
            if action is not None:
                frame, reward, terminated, truncated, _ = rendering.step(action)
                _, reward_free, terminated_free, truncated_free, _ = render_free.step(action)
                assert reward_free == reward  # skipping the drawing changes nothing else
                assert (terminated_free, truncated_free) == (terminated, truncated)
            if k in check_steps:
                yield k, render_free.unwrapped.render_observation(), frame
    finally:
        rendering.close()
        render_free.close()


def test_render_observation_equals_rendering_env_frame_for_same_seed_and_actions():
    checked = []
    for k, drawn, frame in render_free_vs_rendering(11, action_sequence(30, seed=1), check_steps={0, 1, 3, 10, 11, 30}):
        assert drawn.dtype == np.uint8 and drawn.shape == (96, 96, 3)
        assert len(np.unique(drawn.reshape(-1, 3), axis=0)) > 10  # a real frame, not a blank
        # the scene (everything a policy sees after preprocess_observation) is identical
        np.testing.assert_array_equal(drawn[:84], frame[:84])
        # and so is the HUD (speed, ABS, steering and gyro bars) except the printed score
        outside_score = np.ones((96, 96), dtype=bool)
        outside_score[SCORE_BOX] = False
        np.testing.assert_array_equal(drawn[outside_score], frame[outside_score])
        checked.append(k)
    assert checked == [0, 1, 3, 10, 11, 30]


def test_same_seed_and_actions_give_identical_frames_and_other_seed_differs():
    actions = action_sequence(15, seed=2)

    def rollout(seed):
        env = make_car_racing()
        frame, _ = env.reset(seed=seed)
        frames, rewards = [frame], []
        for action in actions:
            frame, reward, *_ = env.step(action)
            frames.append(frame)
            rewards.append(reward)
        env.close()
        return np.stack(frames), rewards

    frames_a, rewards_a = rollout(21)
    frames_b, rewards_b = rollout(21)
    np.testing.assert_array_equal(frames_a, frames_b)
    assert rewards_a == rewards_b
    frames_c, _ = rollout(22)
    assert not np.array_equal(frames_a, frames_c)


# --------------------------------------------------------------------------- geometry and privileged state


def test_env_geometry_is_the_track_centreline_with_env_conventions():
    env = make_car_racing(render_observations=False)
    env.reset(seed=42)
    base = env.unwrapped
    track = np.array(base.track)
    geometry = base.geometry
    np.testing.assert_array_equal(geometry.points, track[:, 2:4])
    assert abs(geometry.total_turn) == pytest.approx(2 * np.pi)
    assert geometry.length / len(track) == pytest.approx(np.mean(geometry.segment_length))
    assert 3.0 < geometry.length / len(track) < 4.0  # CarRacing's TRACK_DETAIL_STEP spacing
    # the env's own beta per tile agrees with the geometry's travel angle (a sign or pi error would not)
    difference = wrap_angle(track[:, 1] - geometry.travel_angle(np.arange(len(track))))
    assert np.max(np.abs(difference)) < 0.2
    # every centreline point projects onto itself, at its own arc length
    projection = geometry.project(track[:, 2:4])
    np.testing.assert_allclose(projection.lateral_error, 0.0, atol=1e-9)
    np.testing.assert_allclose(projection.progress[1:], geometry.vertex_arc[1:], atol=1e-9)
    env.close()


def test_privileged_state_needs_a_reset_env():
    env = make_car_racing(render_observations=False)
    with pytest.raises(RuntimeError, match="reset"):
        privileged_state(env)
    env.close()


def test_privileged_state_at_start_is_on_centreline_at_rest():
    env = make_car_racing(render_observations=False)
    env.reset(seed=0)
    state = privileged_state(env)
    assert abs(state.lateral_error) < 0.1
    assert abs(state.heading_error) < 0.1
    assert state.pose.speed == 0.0
    assert state.progress < 1.0 or state.progress > state.geometry.length - 1.0
    vector = state.as_vector()
    assert vector.dtype == np.float32 and vector.shape == (len(STATE_FIELDS),)
    assert vector[STATE_FIELDS.index("lateral_error")] == pytest.approx(state.lateral_error, abs=1e-6)
    assert vector[STATE_FIELDS.index("heading_error")] == pytest.approx(state.heading_error, abs=1e-6)
    assert vector[STATE_FIELDS.index("forward_speed")] == 0.0
    assert state.curvature_ahead.shape == (7,)
    assert state.geometry is env.unwrapped.geometry
    env.close()


@pytest.mark.parametrize("steer", [1.0, -1.0])
def test_steering_right_moves_car_right_of_centreline_with_negative_heading_error(steer):
    """End-to-end sign check: action steer > 0 turns right (clockwise): lateral error > 0,
    heading error < 0, yaw rate < 0, front wheels turned right (steering_angle < 0)."""
    env = make_car_racing(render_observations=False)
    env.reset(seed=0)
    start_angle = privileged_state(env).pose.angle
    for _ in range(40):
        env.step(np.array([steer, 0.3, 0.0], dtype=np.float32))
    state = privileged_state(env)
    side = np.sign(steer)
    assert side * state.lateral_error > 3.0
    assert side * state.heading_error < -0.5
    assert side * float(wrap_angle(state.pose.angle - start_angle)) < -0.5
    assert side * state.pose.yaw_rate < 0
    assert side * state.pose.steering_angle < 0
    env.close()


# --------------------------------------------------------------------------- PixelJitter


def rollout_frames(env, seed: int, steps: int = 3) -> np.ndarray:
    """The frames of ``steps`` scripted actions after ``reset(seed)`` (the env is closed)."""
    frame, _ = env.reset(seed=seed)
    frames = [frame]
    for action in action_sequence(steps):
        frames.append(env.step(action)[0])
    env.close()
    return np.stack(frames)


def jittered_rollout(seed: int, config: PixelJitterConfig = PixelJitterConfig(), salt: int = 0, steps: int = 3):
    return rollout_frames(PixelJitter(make_car_racing(), config=config, salt=salt), seed, steps)


def clean_rollout(seed: int, steps: int = 3):
    return rollout_frames(make_car_racing(), seed, steps)


def test_pixel_jitter_changes_frames_and_keeps_dtype_and_shape():
    jittered, clean = jittered_rollout(seed=4), clean_rollout(seed=4)
    assert jittered.dtype == np.uint8 and jittered.shape == clean.shape == (4, 96, 96, 3)
    for a, b in zip(jittered, clean):
        assert np.mean(a != b) > 0.5
        # a photometric perturbation, not a different scene
        assert np.corrcoef(a.reshape(-1).astype(float), b.reshape(-1).astype(float))[0, 1] > 0.9
    # per-step pixel noise is fresh each step
    assert not np.array_equal(jittered[1].astype(int) - clean[1], jittered[2].astype(int) - clean[2])


def test_pixel_jitter_is_deterministic_per_reset_seed_and_salt():
    first = jittered_rollout(seed=4)
    np.testing.assert_array_equal(jittered_rollout(seed=4), first)
    assert not np.array_equal(jittered_rollout(seed=4, salt=1)[0], first[0])
    # the reset seed re-seeds the jitter: replaying seed 4 on a used wrapper gives the same frames
    env = PixelJitter(make_car_racing())
    env.reset(seed=9)
    env.step(action_sequence(1)[0])
    env.reset()
    frame, _ = env.reset(seed=4)
    frames = [frame] + [env.step(action)[0] for action in action_sequence(3)]
    np.testing.assert_array_equal(np.stack(frames), first)
    env.close()


def test_pixel_jitter_episode_offset_depends_on_reset_seed_and_is_constant_within_episode():
    brightness_only = PixelJitterConfig(brightness=40.0, contrast=0.0, channel_gain=0.0, noise_std=0.0)

    def offsets(seed):
        jittered = jittered_rollout(seed=seed, config=brightness_only).astype(int)
        clean = clean_rollout(seed=seed).astype(int)
        unclipped = (jittered > 0) & (jittered < 255)
        residual = jittered - clean
        return [np.unique(residual[k][unclipped[k]]) for k in range(len(residual))]

    per_step = offsets(4)
    assert all(len(values) <= 2 for values in per_step)  # one offset (rint may split it in two)
    assert all(np.array_equal(values, per_step[0]) for values in per_step)
    assert np.all(np.abs(per_step[0]) <= 40)
    assert not np.array_equal(offsets(5)[0], per_step[0])


def test_pixel_jitter_with_zero_config_is_identity():
    zero = PixelJitterConfig(brightness=0.0, contrast=0.0, channel_gain=0.0, noise_std=0.0)
    np.testing.assert_array_equal(jittered_rollout(seed=6, config=zero), clean_rollout(seed=6))


@pytest.mark.parametrize("field", ["brightness", "contrast", "channel_gain", "noise_std"])
def test_pixel_jitter_config_rejects_negative_values(field):
    with pytest.raises(ValueError, match=field):
        PixelJitterConfig(**{field: -0.1})


def test_privileged_state_reads_through_wrappers():
    env = PixelJitter(make_car_racing())
    env.reset(seed=0)
    assert isinstance(env, gym.Wrapper)
    assert abs(privileged_state(env).lateral_error) < 0.1
    env.close()
