"""Stable-Baselines3 PPO experts (agents/ppo.py): smoke training, reload, driving, clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from nsacdrive.agents.ppo import (
    CONFIG_FILE,
    MODEL_FILE,
    VECNORMALIZE_FILE,
    OffRoadTermination,
    PPOAgent,
    PPOConfig,
    PrivilegedStateObservation,
    make_pixel_env,
    make_state_env,
    pedal_to_car_action,
    train_ppo,
)
from nsacdrive.agents.registry import make_agent
from nsacdrive.cli import app
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.envs.car_racing import make_car_racing
from nsacdrive.envs.state import STATE_FIELDS, privileged_state

SMOKE = dict(timesteps=2048, n_envs=1, n_steps=256, batch_size=128, n_epochs=2, eval_freq=1024, eval_episodes=1,
             max_episode_steps=120, progress_bar=False)


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
    for name in (MODEL_FILE, VECNORMALIZE_FILE, CONFIG_FILE):
        assert (trained / name).is_file()
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


def test_resume_continues_counting(trained, tmp_path):
    folder = tmp_path / "resumed"
    shutil.copytree(trained, folder)
    model = train_ppo(PPOConfig(**{**SMOKE, "timesteps": 256, "eval_freq": 0}), folder, resume=True)
    assert model.num_timesteps >= 2048 + 256
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
    for name in (CONFIG_FILE, MODEL_FILE, VECNORMALIZE_FILE):
        folder = tmp_path / f"without-{name}"
        shutil.copytree(trained, folder)
        (folder / name).unlink()
        with pytest.raises(ValueError, match=f"{name} is missing"):
            PPOAgent(folder)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_model_gives_clear_error(trained, tmp_path, damage):
    folder = tmp_path / "corrupt"
    shutil.copytree(trained, folder)
    model = folder / MODEL_FILE
    data = model.read_bytes()
    model.write_bytes(b"not a zip at all" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.zip is corrupt"):
        PPOAgent(folder)


def test_corrupt_vecnormalize_gives_clear_error(trained, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(trained, folder)
    (folder / VECNORMALIZE_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"vecnormalize\.pkl is corrupt"):
        PPOAgent(folder)


def test_cli_train_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["expert", "train", "--obs", "lidar", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--obs" in result.output
    result = runner.invoke(app, ["expert", "train", "--out", str(tmp_path / "empty"), "--resume", "--timesteps", "10"])
    assert result.exit_code == 2 and "config.json is missing" in result.output
