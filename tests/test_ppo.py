"""Stable-Baselines3 PPO experts (agents/ppo.py): smoke training, reload, driving, clear errors,
and driving from the exported safetensors + JSON alone, never from a pickle."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import pickle
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from typer.testing import CliRunner

import nsacdrive.agents.ppo_envs as ppo_envs
from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.ppo import (
    PPOAgent,
    env_factory,
    export_policy,
    new_penalty_ramp,
    train_ppo,
    vec_envs,
)
from nsacdrive.agents.ppo_config import PPOConfig
from nsacdrive.agents.ppo_curve import CURVE_FIGURE, CURVE_FILE, best_point, new_curve_recorder, read_curve
from nsacdrive.agents.ppo_envs import (
    ActionChangePenalty,
    ActionNoise,
    CentrePenalty,
    LapSuccess,
    MissedTilePenalty,
    OffRoadTermination,
    PedalAction,
    PrivilegedStateObservation,
    make_pixel_env,
    make_state_env,
)
from nsacdrive.agents.ppo_policy import CONFIG_FILE, MODEL_FILE, POLICY_FILE, POLICY_WEIGHTS_FILE, VECNORMALIZE_FILE
from nsacdrive.agents.registry import make_agent
from nsacdrive.agents.rollout import pedal_to_car_action
from nsacdrive.cli import app
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.data_collection.recorder import CollectConfig, collect, state_labeller
from nsacdrive.envs.car_racing import make_car_racing
from nsacdrive.envs.state import STATE_FIELDS, privileged_state, shifted_sideways, state_columns

#: a few float32 roundings of an action in [-1, 1]: the rebuilt policy runs the same float32 arithmetic
ACTION_TOLERANCE = 4 * float(np.finfo(np.float32).eps)
SMOKE = dict(timesteps=2048, n_envs=1, n_steps=256, batch_size=128, n_epochs=2, eval_freq=1024, eval_episodes=1,
             max_episode_steps=120, progress_bar=False, state_fields="all")  # the whole vector: the tests below feed it


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo") / "state"
    train_ppo(PPOConfig.state_recipe(**SMOKE), out)
    return out


def test_pedal_axis_never_presses_gas_and_brake_together():
    np.testing.assert_allclose(pedal_to_car_action(np.array([0.3, 0.6])), [0.3, 0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(pedal_to_car_action(np.array([-2.0, -0.25])), [-1.0, 0.0, 0.25], rtol=1e-6)
    env = make_state_env(seed=3, pedal_action=True, frame_skip=2)
    assert env.action_space.shape == (2,)
    env.step(np.array([0.0, 1.0], dtype=np.float32))


def test_off_road_termination_ends_training_episodes_with_a_penalty():
    env = make_state_env(seed=3, off_road_patience=5, off_road_penalty=20.0)
    env.reset(seed=3)
    steps, reward, terminated, info = 0, 0.0, False, {}
    while not terminated and steps < 400:  # full lock and throttle: the car leaves the road
        _, reward, terminated, truncated, info = env.step(np.array([1.0, 1.0, 0.0], dtype=np.float32))
        steps += 1
    assert terminated and info.get("off_road_termination") and reward < -19
    plain = make_state_env(seed=3)  # evaluation envs: no such termination
    assert not isinstance(plain, OffRoadTermination)


def test_state_wrapper_gives_privileged_vector():
    env = make_state_env(seed=5, max_episode_steps=50)
    assert isinstance(env, PrivilegedStateObservation)
    observation, _ = env.reset(seed=5)
    assert observation.shape == (len(STATE_FIELDS),) and observation.dtype == np.float32
    assert env.observation_space.contains(observation)
    np.testing.assert_array_equal(observation, privileged_state(env).as_vector())
    observation, *_ = env.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(observation, privileged_state(env).as_vector())
    env.close()


def test_state_with_frame_skip_is_read_once_per_decision_after_the_last_physics_step(monkeypatch):
    reads = []
    monkeypatch.setattr(ppo_envs, "privileged_state", lambda env: reads.append(1) or privileged_state(env))
    env = make_state_env(max_episode_steps=50, frame_skip=2, pedal_action=True)
    env.reset(seed=5)
    for _ in range(3):
        observation, *_ = env.step(np.array([0.2, 0.6], dtype=np.float32))
        np.testing.assert_array_equal(observation, privileged_state(env).as_vector())
    assert len(reads) == 1 + 3  # the reset and one per decision, not one per physics step
    env.close()


def wrappers_of(env) -> list[type]:
    kinds = []
    while hasattr(env, "env"):
        kinds.append(type(env))
        env = env.env
    return kinds


def test_shaping_is_only_in_training_envs_and_laps_are_counted_only_in_evaluation_envs():
    config = PPOConfig.state_recipe(max_episode_steps=20, centre_penalty=0.1, missed_tile_penalty=25.0, action_change_penalty=1.0,
                                    action_noise=0.1)
    training, evaluation = (env_factory(config, training=flag)() for flag in (True, False))
    for shaping in (OffRoadTermination, CentrePenalty, MissedTilePenalty, ActionChangePenalty, ActionNoise):
        assert shaping in wrappers_of(training) and shaping not in wrappers_of(evaluation)
    assert PedalAction in wrappers_of(training) and PedalAction in wrappers_of(evaluation)  # the action space is the policy's
    venv = vec_envs(config, seed=3, n_envs=1, training=False)
    venv.reset()
    done, infos = False, [{}]
    while not done:
        _, _, dones, infos = venv.step(np.zeros((1, 2), dtype=np.float32))
        done = bool(dones[0])
    assert infos[0]["is_success"] is False  # 20 physics steps: no lap, counted as one not finished
    venv.close()


class _Finishes(gym.Env):
    """Ends its one-step episodes with ``lap_finished`` as told."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def __init__(self, lap_finished: bool) -> None:
        self.lap_finished = lap_finished

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, self.lap_finished, not self.lap_finished, {"lap_finished": self.lap_finished}


def test_centre_penalty_charges_the_distance_from_the_centreline():
    plain, shaped = make_state_env(seed=4), CentrePenalty(make_state_env(seed=4), coef=0.5)
    for env in (plain, shaped):
        env.reset(seed=4)
    for _ in range(40):  # steer off the centreline
        action = np.array([0.6, 0.4, 0.0], dtype=np.float32)
        observation, reward, *_ = plain.step(action)
        _, shaped_reward, *_ = shaped.step(action)
        lateral = abs(float(observation[STATE_FIELDS.index("lateral_error")]))
        assert shaped_reward == pytest.approx(reward - 0.5 * lateral, abs=1e-9)
    assert lateral > 1.0  # the test drove somewhere the penalty bites


def test_missed_tile_penalty_charges_each_tile_driven_past_untouched():
    env = make_state_env(seed=6, missed_tile_penalty=25.0)
    shaped = env
    while not isinstance(shaped, MissedTilePenalty):
        shaped = shaped.env
    env.reset(seed=6)
    expert = PurePursuitExpert()

    def drive(steps: int) -> list[float]:
        return [env.step(expert.act(None, privileged_state(env)))[1] for _ in range(steps)]

    assert min(drive(100)) > -1.0  # the expert touches every tile: no penalty
    skipped = shaped.checked  # a tile the car has passed but the wrapper has not judged yet: now "untouched"
    env.unwrapped.road[skipped].road_visited = False
    rewards = drive(60)
    assert shaped.checked > skipped
    assert sum(r < -20 for r in rewards) == 1 and min(rewards) > -26.0  # charged once, 25 less one step's reward
    env.close()


def test_action_change_penalty_charges_the_l1_change_of_the_policy_action():
    env = ActionChangePenalty(_Finishes(False), coef=2.0)
    env.reset()
    assert env.step(np.array([0.5], np.float32))[1] == 1.0  # nothing to compare the first action with
    assert env.step(np.array([-0.25], np.float32))[1] == pytest.approx(1.0 - 2.0 * 0.75)
    assert env.step(np.array([-3.0], np.float32))[1] == pytest.approx(1.0 - 2.0 * 0.75)  # as executed: clipped to -1
    env.reset()
    assert env.step(np.array([1.0], np.float32))[1] == 1.0  # a new episode forgets the last action
    env.scale_action_change_penalty(0.5)
    assert env.step(np.array([0.0], np.float32))[1] == pytest.approx(1.0 - 0.5 * 2.0 * 1.0)


def test_action_noise_perturbs_each_physics_step_from_its_own_seeded_stream():
    def executed(sigma: float, seed: int) -> np.ndarray:
        base = make_car_racing(render_observations=False, max_episode_steps=30)
        sent = []
        base.step = (lambda step: lambda action: sent.append(np.array(action)) or step(action))(base.step)
        env = ppo_envs.FrameSkip(ActionNoise(base, sigma), 2)
        env.reset(seed=seed)
        for _ in range(5):
            env.step(np.array([0.1, 0.5, 0.0], np.float32))
        return np.stack(sent)

    noisy = executed(0.2, seed=4)
    assert len(noisy) == 10 and len(np.unique(noisy[:, 0])) == 10  # fresh noise at every physics step
    np.testing.assert_array_equal(noisy, executed(0.2, seed=4))
    assert not np.array_equal(noisy, executed(0.2, seed=5))
    assert np.abs(noisy[:, 0] - 0.1).std() > 0.05 and (noisy[:, 1] * noisy[:, 2] == 0).all()  # never gas and brake together


def test_the_action_change_penalty_ramps_with_the_model_clock_from_zero_to_full():
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: make_state_env(max_episode_steps=20, pedal_action=True, action_change_penalty=3.0)])
    model = SimpleNamespace(get_env=lambda: venv, logger=None, num_timesteps=0)
    ramp = new_penalty_ramp(warmup=1000)
    ramp.init_callback(model)
    scales = []
    for clock in (0, 250, 1000, 5000):  # a resumed model starts its clock where it stopped
        model.num_timesteps = clock
        ramp.on_rollout_start()
        scales.append(venv.get_attr("scale")[0])
    assert scales == [0.0, 0.25, 1.0, 1.0]
    venv.close()


@pytest.mark.parametrize("finished", [True, False])
def test_lap_success_marks_the_end_of_an_episode(finished):
    env = LapSuccess(_Finishes(finished))
    env.reset()
    *_, info = env.step(np.zeros(1, np.float32))
    assert info["is_success"] is finished


def test_the_pixel_recipe_trains_and_evaluates(tmp_path):
    config = PPOConfig.pixels_recipe(n_envs=1, n_steps=16, batch_size=16, n_epochs=1, timesteps=32, eval_freq=16, eval_episodes=1,
                                     max_episode_steps=20, device="cpu", progress_bar=False)
    train_ppo(config, tmp_path, log=lambda message: None)
    assert [point.timesteps for point in read_curve(tmp_path / "eval")] == [16, 32]
    agent = PPOAgent(tmp_path / "best")
    env = make_car_racing(max_episode_steps=20)
    observation, _ = env.reset(seed=0)
    action = agent.act(observation, privileged_state(env))
    assert action.shape == (3,) and env.action_space.contains(action.astype(np.float32))


def test_pixel_recipe_constructs():
    config = PPOConfig.pixels_recipe()
    assert (config.frame_stack, config.frame_skip, config.n_envs, config.timesteps) == (2, 2, 8, 4_000_000)
    assert config.use_sde and not config.norm_obs and config.norm_reward and config.linear_lr
    env = make_pixel_env(seed=1, max_episode_steps=10)
    observation, _ = env.reset(seed=1)
    assert observation.shape == (64, 64, 1) and observation.dtype == np.uint8
    env.close()


def test_config_validation():
    with pytest.raises(ValueError, match="obs"):
        PPOConfig(obs="lidar")
    with pytest.raises(ValueError, match="timesteps"):
        PPOConfig(timesteps=0)


def test_smoke_training_saves_reloads_and_acts(trained):
    for name in (MODEL_FILE, VECNORMALIZE_FILE, CONFIG_FILE, POLICY_FILE, POLICY_WEIGHTS_FILE):
        assert (trained / name).is_file() and (trained / "best" / name).is_file()
    assert not list(trained.glob(".*.partial"))
    assert (trained / "tensorboard").is_dir()
    assert json.loads((trained / CONFIG_FILE).read_text())["obs"] == "state"
    agent = make_agent(f"ppo:{trained}")
    assert isinstance(agent, PPOAgent)
    assert (agent.source, agent.needs_pixels, agent.agent_id) == ("ppo", False, "ppo-state")
    assert agent.config()["num_timesteps"] >= 2048
    env = make_car_racing(render_observations=False, max_episode_steps=30)
    env.reset(seed=7)
    agent.reset()
    for _ in range(5):
        action = agent.act(np.zeros((96, 96, 3), np.uint8), privileged_state(env))
        assert action.shape == (3,) and action.dtype == np.float32
        assert env.action_space.contains(action)
        env.step(action)
    env.close()
    # The best evaluated model is itself a loadable ppo: folder.
    best = PPOAgent(trained / "best")
    assert best.agent_id == "ppo-state"


def test_training_records_and_plots_its_learning_curve(trained):
    points = read_curve(trained / "eval")
    assert [p.timesteps for p in points] == [1024, 2048]  # SMOKE: every 1024 decisions
    assert all(0.0 <= p.lap_rate <= 1.0 and p.score_std >= 0.0 for p in points)
    assert 0.0 < points[0].seconds <= points[1].seconds
    assert (trained / "eval" / CURVE_FIGURE).read_bytes().startswith(b"\x89PNG")


def test_resumed_training_extends_the_curve_and_keeps_a_better_best(trained, tmp_path):
    folder = tmp_path / "resumed"
    shutil.copytree(trained, folder)
    earlier = read_curve(folder / "eval")
    best_sha = json.loads((folder / "best" / POLICY_FILE).read_text())["weights_sha256"]
    train_ppo(PPOConfig(**{**SMOKE, "timesteps": 1024}), folder, resume=True)
    points = read_curve(folder / "eval")
    assert points[:2] == earlier and [p.timesteps for p in points[2:]] == [3072]
    assert points[2].seconds >= earlier[-1].seconds  # the clock goes on from where the first session stopped
    kept = json.loads((folder / "best" / POLICY_FILE).read_text())["weights_sha256"] == best_sha
    assert kept == (best_point(points) is not points[2])  # replaced only by a better evaluation


@pytest.mark.parametrize("log_path", [None, "eval"])
def test_the_curve_recorder_refuses_an_evaluation_that_keeps_no_per_episode_results(tmp_path, log_path):
    recorder = new_curve_recorder(tmp_path, save_best=lambda: None)
    recorder.parent = SimpleNamespace(log_path=log_path)
    model = SimpleNamespace(get_env=lambda: None, logger=None)
    if log_path is None:
        with pytest.raises(ValueError, match="needs EvalCallback\\(log_path=...\\)"):
            recorder.init_callback(model)
    else:
        recorder.init_callback(model)


def test_a_damaged_curve_gives_a_clear_error(tmp_path):
    (tmp_path / CURVE_FILE).write_text("{\"points\": [{\"steps\": 1}]}")
    with pytest.raises(ValueError, match="curve.json is not a learning curve"):
        read_curve(tmp_path)


def test_resume_continues_counting(trained, tmp_path):
    folder = tmp_path / "resumed"
    shutil.copytree(trained, folder)
    model = train_ppo(PPOConfig(**{**SMOKE, "timesteps": 256, "eval_freq": 0}), folder, resume=True)
    assert model.num_timesteps >= 2048 + 256
    assert PPOAgent(folder).config()["num_timesteps"] == model.num_timesteps  # the export follows the model
    with pytest.raises(FileExistsError, match="--resume"):
        train_ppo(PPOConfig(**SMOKE), folder)
    with pytest.raises(ValueError, match="obs='state'"):
        train_ppo(PPOConfig.pixels_recipe(timesteps=10), folder, resume=True)


def test_collect_with_ppo_agent_records_images(trained, tmp_path):
    out = tmp_path / "data"
    result = CliRunner().invoke(app, ["collect", "--agent", f"ppo:{trained}", "--seeds", "3", "--out", str(out),
                                      "--workers", "1", "--max-steps", "40"])
    assert result.exit_code == 0, result.output
    sidecars = sidecar_paths(out)
    assert len(sidecars) == 1
    metadata, arrays = load_episode_arrays(sidecars[0])
    assert metadata["source"] == "ppo" and metadata["agent"]["agent_id"] == "ppo-state"
    assert arrays["observations"].shape[1:] == (96, 96, 3)
    assert arrays["observations"].max() > 0  # images were rendered although the policy reads state


def test_missing_paths_give_clear_errors(trained, tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        make_agent(f"ppo:{tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="ppo needs a model folder"):
        make_agent("ppo:")
    for name in (CONFIG_FILE, POLICY_FILE, POLICY_WEIGHTS_FILE):
        folder = tmp_path / f"without-{name}"
        shutil.copytree(trained, folder)
        (folder / name).unlink()
        with pytest.raises(ValueError, match=f"{name} is missing"):
            PPOAgent(folder)
    for name in (MODEL_FILE, VECNORMALIZE_FILE):  # only resuming and exporting need them
        folder = tmp_path / f"without-{name}"
        shutil.copytree(trained, folder)
        (folder / name).unlink()
        PPOAgent(folder)
        with pytest.raises(ValueError, match=f"{name} is missing"):
            export_policy(folder)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_export_of_a_corrupt_model_gives_clear_error(trained, tmp_path, damage):
    folder = tmp_path / "corrupt"
    shutil.copytree(trained, folder)
    model = folder / MODEL_FILE
    data = model.read_bytes()
    model.write_bytes(b"not a zip at all" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.zip is corrupt"):
        export_policy(folder)


def test_export_of_corrupt_vecnormalize_gives_clear_error(trained, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(trained, folder)
    (folder / VECNORMALIZE_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"vecnormalize\.pkl is corrupt"):
        export_policy(folder)


def _trusted_sb3(folder: Path):
    """The SB3 model and VecNormalize of a folder this test wrote itself (loading them runs pickles)."""
    from stable_baselines3 import PPO

    with open(folder / VECNORMALIZE_FILE, "rb") as handle:
        vecnorm = pickle.load(handle)
    return PPO.load(str(folder / MODEL_FILE), device="cpu"), vecnorm


def _sb3_action(model, vecnorm, policy_input: np.ndarray) -> np.ndarray:
    """What the trained SB3 model does, as EvalCallback and VecNormalize run it."""
    action, _ = model.predict(vecnorm.normalize_obs(policy_input[None]), deterministic=True)
    return np.asarray(action, dtype=np.float32).reshape(-1)


def _driven_states(seed: int, steps: int) -> list:
    """Privileged states along a drive with random actions (on and off the road)."""
    rng = np.random.default_rng(seed)
    env = make_car_racing(render_observations=False, max_episode_steps=steps)
    env.reset(seed=seed)
    states = []
    for _ in range(steps):
        states.append(privileged_state(env))
        _, _, terminated, truncated, _ = env.step(np.array([rng.uniform(-1, 1), rng.uniform(0, 1), 0.0], np.float32))
        if terminated or truncated:
            break
    env.close()
    return states


@pytest.mark.parametrize("sub", [".", "best"])
def test_exported_state_policy_acts_like_the_sb3_model(trained, sub):
    folder = trained / sub
    model, vecnorm = _trusted_sb3(folder)
    agent = PPOAgent(folder)
    states = _driven_states(seed=11, steps=150)
    rng = np.random.default_rng(0)
    spread = rng.normal(vecnorm.obs_rms.mean, 4 * np.sqrt(vecnorm.obs_rms.var), size=(300, len(STATE_FIELDS)))
    inputs = [state.as_vector() for state in states] + list(spread.astype(np.float32))
    ours = np.stack([agent.decide(x) for x in inputs])
    theirs = np.stack([_sb3_action(model, vecnorm, x) for x in inputs])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ACTION_TOLERANCE)
    assert np.ptp(theirs, axis=0).min() > 0.01  # the comparison spans different actions
    for state in states[:20]:  # act(): a fresh decision after reset, as (steer, gas, brake)
        agent.reset()
        expected = pedal_to_car_action(_sb3_action(model, vecnorm, state.as_vector()))
        np.testing.assert_allclose(agent.act(np.zeros((96, 96, 3), np.uint8), state), expected, rtol=0, atol=ACTION_TOLERANCE)
    assert agent.config()["num_timesteps"] == model.num_timesteps


def test_a_state_policy_labels_any_state_without_disturbing_its_held_decision(trained):
    agent = PPOAgent(trained)
    states = _driven_states(seed=12, steps=40)
    frame = np.zeros((96, 96, 3), np.uint8)
    held = agent.act(frame, states[0])  # a decision, held for the next step (frame_skip 2)
    for state in states[1:6]:
        moved = shifted_sideways(state, 2.0)
        np.testing.assert_array_equal(agent.label_state(moved), pedal_to_car_action(agent.decide(moved.as_vector())))
    np.testing.assert_array_equal(agent.act(frame, states[1]), held)
    assert state_labeller(agent) == agent.label_state and state_labeller(PurePursuitExpert()) is not None


def test_a_policy_of_the_camera_fields_reads_them_alone_in_training_driving_and_labelling(tmp_path):
    columns = state_columns("camera")
    names = [STATE_FIELDS[i] for i in columns]
    assert "rear_wheel_slip" not in names and "progress_fraction" not in names and "curvature_45" not in names
    np.testing.assert_array_equal(state_columns("all"), np.arange(len(STATE_FIELDS)))
    env = make_state_env(seed=4, pedal_action=True, frame_skip=2, state_fields="camera", off_road_patience=3, off_road_penalty=5.0)
    observation, _ = env.reset(seed=4)
    np.testing.assert_array_equal(observation, privileged_state(env).as_vector()[columns])
    terminated, steps = False, 0
    while not terminated and steps < 300:  # the shaping below the subset still reads the lateral error
        observation, _, terminated, _, info = env.step(np.array([1.0, 1.0], np.float32))
        steps += 1
    assert observation.shape == (len(columns),) and info.get("off_road_termination")
    folder = tmp_path / "camera"
    train_ppo(PPOConfig.state_recipe(**{**SMOKE, "eval_freq": 0, "state_fields": "camera"}), folder)
    model, vecnorm = _trusted_sb3(folder)
    agent = PPOAgent(folder)
    for state in _driven_states(seed=11, steps=30)[:10]:
        expected = pedal_to_car_action(_sb3_action(model, vecnorm, state.as_vector()[columns]))
        np.testing.assert_allclose(agent.label_state(state), expected, rtol=0, atol=ACTION_TOLERANCE)
        agent.reset()
        np.testing.assert_allclose(agent.act(np.zeros((96, 96, 3), np.uint8), state), expected, rtol=0, atol=ACTION_TOLERANCE)
    with pytest.raises(ValueError, match="state_fields must be one of all, camera, got 'lidar'"):
        PPOConfig(state_fields="lidar")


def test_a_ppo_teacher_labels_the_side_cameras_of_a_front_camera_recording(trained, tmp_path):
    collect(CollectConfig(agent=f"ppo:{trained}", seeds=[5], max_steps=24, env="udacity-style", side_offset=2.0), tmp_path,
            progress=False)
    sidecar, arrays = load_episode_arrays(sidecar_paths(tmp_path)[0], include_observations=False)
    assert sidecar["side_offset"] == 2.0
    left, right = arrays["left_expert_actions"], arrays["right_expert_actions"]
    assert left.shape == right.shape == arrays["expert_actions"].shape
    assert np.abs(left[:, 0] - right[:, 0]).max() > 0  # two positions across the road, two answers


def test_exported_pixel_policy_acts_like_the_sb3_model(tmp_path):
    folder = tmp_path / "pixels"
    train_ppo(PPOConfig.pixels_recipe(timesteps=16, n_envs=1, n_steps=16, batch_size=16, n_epochs=1, eval_freq=0,
                                      max_episode_steps=40, progress_bar=False), folder)
    model, vecnorm = _trusted_sb3(folder)
    agent = PPOAgent(folder)
    assert agent.needs_pixels and agent.exported.normalization is None
    frames = np.random.default_rng(1).integers(0, 256, size=(20, 64, 64, 2), dtype=np.uint8)
    ours = np.stack([agent.decide(frame) for frame in frames])
    theirs = np.stack([_sb3_action(model, vecnorm, frame) for frame in frames])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ACTION_TOLERANCE)
    env = make_car_racing(max_episode_steps=10)
    observation, _ = env.reset(seed=2)
    for _ in range(4):
        action = agent.act(observation, privileged_state(env))
        assert env.action_space.contains(action)
        observation, *_ = env.step(action)
    env.close()


class CreatesFile:
    """Unpickling this creates ``path``: a stand-in for whatever code a malicious pickle runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def _plant_malicious_pickles(folder: Path, marker: Path) -> None:
    """Replace vecnormalize.pkl by a pickle, and model.zip's policy_class by a ``:serialized:``
    cloudpickle payload, that each create ``marker`` when loaded."""
    payload = pickle.dumps(CreatesFile(marker))
    (folder / VECNORMALIZE_FILE).write_bytes(payload)
    model = folder / MODEL_FILE
    with zipfile.ZipFile(model) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    data["policy_class"] = {":serialized:": base64.b64encode(payload).decode()}
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(model, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)


def test_the_planted_payloads_run_when_loaded_the_unsafe_way(trained, tmp_path):
    """The control for the next test: SB3 and pickle do execute these payloads."""
    from stable_baselines3 import PPO

    folder, marker = tmp_path / "control", tmp_path / "control-marker"
    shutil.copytree(trained, folder)
    _plant_malicious_pickles(folder, marker)
    with open(folder / VECNORMALIZE_FILE, "rb") as handle:
        pickle.load(handle)
    assert marker.exists()
    marker.unlink()
    with contextlib.suppress(Exception):  # the payload runs before SB3 finds policy_class broken
        PPO.load(str(folder / MODEL_FILE), device="cpu")
    assert marker.exists()


def test_driving_never_loads_the_pickles(trained, tmp_path):
    folder, marker = tmp_path / "planted", tmp_path / "marker"
    shutil.copytree(trained, folder)
    _plant_malicious_pickles(folder, marker)
    agent = PPOAgent(folder)
    env = make_car_racing(render_observations=False, max_episode_steps=20)
    env.reset(seed=4)
    for _ in range(10):
        env.step(agent.act(np.zeros((96, 96, 3), np.uint8), privileged_state(env)))
    env.close()
    result = CliRunner().invoke(app, ["collect", "--agent", f"ppo:{folder}", "--seeds", "0", "--max-steps", "20",
                                      "--workers", "1", "--out", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert len(sidecar_paths(tmp_path / "data")) == 1
    assert not marker.exists()


def test_folder_without_exported_files_is_refused_until_exported(trained, tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(trained, folder)
    for name in (POLICY_FILE, POLICY_WEIGHTS_FILE):
        (folder / name).unlink()
    with pytest.raises(ValueError, match=rf"policy\.json is missing: .*nsacdrive expert export {folder}.*execute code"):
        PPOAgent(folder)
    runner = CliRunner()
    result = runner.invoke(app, ["collect", "--agent", f"ppo:{folder}", "--seeds", "0", "--max-steps", "20",
                                 "--workers", "1", "--out", str(tmp_path / "data")])
    assert result.exit_code == 2 and "error: " in result.output and "policy.json is missing" in result.output
    result = runner.invoke(app, ["expert", "export", str(folder)])
    assert result.exit_code == 0, result.output
    assert str(folder / POLICY_FILE) in result.output
    exported, original = PPOAgent(folder), PPOAgent(trained)
    inputs = [state.as_vector() for state in _driven_states(seed=5, steps=40)]
    np.testing.assert_array_equal([exported.decide(x) for x in inputs], [original.decide(x) for x in inputs])


def test_cli_export_warns_and_fails_clearly(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["expert", "export", "--help"])
    assert result.exit_code == 0 and "execute code" in " ".join(result.output.split())
    result = runner.invoke(app, ["expert", "export", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "is not a folder" in result.output


def _rewrite_json(folder: Path, change) -> None:
    path = folder / POLICY_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _replace_weights(folder: Path, weights: bytes) -> None:
    """New weights bytes with a matching checksum: what a consistent but wrong export looks like."""
    (folder / POLICY_WEIGHTS_FILE).write_bytes(weights)
    _rewrite_json(folder, lambda data: data.update(weights_sha256=hashlib.sha256(weights).hexdigest()))


def _narrower_weights(folder: Path) -> None:
    import safetensors.torch

    tensors = safetensors.torch.load((folder / POLICY_WEIGHTS_FILE).read_bytes())
    name = "mlp_extractor.policy_net.0.weight"
    _replace_weights(folder, safetensors.torch.save({**tensors, name: tensors[name][:64].contiguous()}))


def _dropped_tensor(folder: Path) -> None:
    import safetensors.torch

    tensors = safetensors.torch.load((folder / POLICY_WEIGHTS_FILE).read_bytes())
    _replace_weights(folder, safetensors.torch.save({k: v for k, v in tensors.items() if k != "log_std"}))


def _set(section: str, key: str, value):
    return lambda folder: _rewrite_json(folder, lambda data: data[section].__setitem__(key, value))


BAD_EXPORTS = {
    "json-garbage": (lambda folder: (folder / POLICY_FILE).write_text("{not json"), r"policy\.json is not JSON"),
    "json-list": (lambda folder: (folder / POLICY_FILE).write_text("[]"), r"policy\.json is not an exported PPO policy"),
    "version": (lambda folder: _rewrite_json(folder, lambda data: data.update(version=99)), r"format version 99 is not supported"),
    "no-checksum": (lambda folder: _rewrite_json(folder, lambda data: data.pop("weights_sha256")),
                    r"field 'weights_sha256' must be a sha256 hex digest, got nothing \(missing\)"),
    "bad-checksum": (lambda folder: _rewrite_json(folder, lambda data: data.update(weights_sha256="abc")),
                     r"field 'weights_sha256' must be a sha256 hex digest \(64 lowercase hex digits\), got 'abc'"),
    "activation": (_set("policy", "activation_fn", "swish"), r"field 'policy\.activation_fn' must be one of tanh, relu, gelu, got 'swish'"),
    "flag-type": (_set("policy", "use_sde", "no"), r"field 'policy\.use_sde' must be true or false, got 'no'"),
    "infinite-std": (_set("policy", "log_std_init", float("inf")), r"field 'policy\.log_std_init' must be a finite number, got inf"),
    "net-arch": (_set("policy", "net_arch", {"pi": [64, 64], "vf": [256, 256]}),
                 r"policy\.safetensors: tensor 'action_net\.weight' is torch\.float32 \[2, 256\], "
                 r"the architecture in policy\.json needs torch\.float32 \[2, 64\]"),
    "obs-shape": (_set("observation_space", "shape", [7]), r"observation_space shape \[7\] does not match obs='state'"),
    "huge-space": (_set("observation_space", "shape", [100_000, 100_000]),  # refused before 80 GB of bounds are made
                   r"field 'observation_space\.shape' must be a non-empty list of positive sizes of at most 1048576 elements"),
    "huge-layer": (_set("policy", "net_arch", [10**9]), r"field 'policy\.net_arch' must be a list of layer sizes"),
    "huge-extractor": (_set("policy", "features_extractor_kwargs", {"features_dim": 10**9}),
                       r"field 'policy\.features_extractor_kwargs\.features_dim' must be a number of at most 65536"),
    "action-shape": (lambda folder: _rewrite_json(folder, lambda data: data["action_space"].update(shape=[3], low=-1, high=1)),
                     r"action_space shape \[3\] does not match pedal_action=True"),
    "bounds": (_set("action_space", "low", "minus one"), r"field 'action_space\.low' must be a number or a list of 2 numbers"),
    "stats-length": (_set("obs_normalization", "mean", [0.0]), rf"field 'obs_normalization\.mean' must be a list of {len(STATE_FIELDS)} finite numbers"),
    "stats-missing": (lambda folder: _rewrite_json(folder, lambda data: data["obs_normalization"].pop("var")),
                      r"field 'obs_normalization\.var' must be a list of \d+ finite numbers, got nothing \(missing\)"),
    "checksum": (lambda folder: (folder / POLICY_WEIGHTS_FILE).write_bytes((folder / POLICY_WEIGHTS_FILE).read_bytes()[:-1] + b"\x00"),
                 r"policy\.safetensors is corrupt: its sha256 is [0-9a-f]{64}, policy\.json expects [0-9a-f]{64}"),
    "not-safetensors": (lambda folder: _replace_weights(folder, b"garbage bytes"), r"policy\.safetensors is not a safetensors file"),
    "narrower-tensor": (_narrower_weights, r"tensor 'mlp_extractor\.policy_net\.0\.weight' is torch\.float32 \[64, \d+\], "
                                           r"the architecture in policy\.json needs torch\.float32 \[256, \d+\]"),
    "missing-tensor": (_dropped_tensor, r"tensors do not match the architecture in policy\.json \(missing \['log_std'\], unexpected \[\]\)"),
}


@pytest.mark.parametrize("damage", sorted(BAD_EXPORTS))
def test_bad_exported_files_give_clear_errors(trained, tmp_path, damage):
    folder = tmp_path / damage
    shutil.copytree(trained, folder)
    spoil, message = BAD_EXPORTS[damage]
    spoil(folder)
    with pytest.raises(ValueError, match=message):
        PPOAgent(folder)


def test_cli_train_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["expert", "train", "--obs", "lidar", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--obs" in result.output
    result = runner.invoke(app, ["expert", "train", "--out", str(tmp_path / "empty"), "--resume", "--timesteps", "10"])
    assert result.exit_code == 2 and "config.json is missing" in result.output


def test_cli_train_passes_the_training_env_options_over_the_recipe(tmp_path, monkeypatch):
    import nsacdrive.agents.ppo as ppo

    seen = []
    monkeypatch.setattr(ppo, "train_ppo", lambda config, out, resume, log: seen.append(config) or SimpleNamespace(num_timesteps=0))
    runner = CliRunner()
    result = runner.invoke(app, ["expert", "train", "--out", str(tmp_path / "a"), "--action-noise", "0.1", "--action-change-warmup", "100000",
                                 "--action-change-penalty", "10", "--state-fields", "all"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["expert", "train", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert [(c.action_noise, c.action_change_warmup, c.action_change_penalty) for c in seen] == [(0.1, 100_000, 10.0), (0.0, 300_000, 3.0)]
    assert seen[0] == PPOConfig.state_recipe(seed=0, progress_bar=True, action_noise=0.1, action_change_warmup=100_000,
                                             action_change_penalty=10.0, state_fields="all")
    assert seen[1].state_fields == "camera"  # the recipe's


def test_the_device_of_the_updates_is_checked_and_resuming_may_move_it(tmp_path):
    assert (PPOConfig.state_recipe().device, PPOConfig.pixels_recipe().device) == ("cpu", "auto")
    with pytest.raises(ValueError, match="PPO config device: expected auto or a torch device .* got 'gpu'"):
        PPOConfig.state_recipe(device="gpu")
    config = PPOConfig.state_recipe(timesteps=64, n_steps=32, batch_size=32, n_epochs=1, eval_freq=0, max_episode_steps=20,
                                    progress_bar=False)
    train_ppo(config, tmp_path, log=lambda message: None)
    model = train_ppo(replace(config, device="auto"), tmp_path, resume=True, log=lambda message: None)
    assert json.loads((tmp_path / "config.json").read_text())["device"] == "auto" and model.num_timesteps >= 128


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cli_train_refuses_cuda_where_there_is_none(tmp_path):
    result = CliRunner().invoke(app, ["expert", "train", "--out", str(tmp_path / "a"), "--device", "cuda"])
    assert result.exit_code != 0 and "CUDA is not available" in result.output
    assert not (tmp_path / "a").exists()
