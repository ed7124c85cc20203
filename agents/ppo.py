"""Stable-Baselines3 PPO experts: training (``nsacdrive expert train``) and the ``ppo:DIR`` agent.

Two observation kinds:

- ``state``: the privileged state vector (:data:`nsacdrive.envs.state.STATE_FIELDS`, float32) from a
  render-free env, so training runs at physics speed. VecNormalize normalises observations and
  rewards. :meth:`PPOConfig.state_recipe` adds three standard shapings of the control problem
  (not of the score): one signed pedal axis instead of gas and brake (a Gaussian policy over
  both presses them together and the car crawls), each decision held for 2 physics steps, and,
  in the TRAINING envs only, an episode ends with a penalty after a stretch off the road (no
  time wasted on grass). Evaluation envs are plain CarRacing.
- ``pixels``: rl-baselines3-zoo's CarRacing-v3 PPO recipe (frame skip 2, 64×64 grey, frame stack 2,
  8 envs, 4M steps, n_steps 512, batch 128, 10 epochs, linear lr 1e-4, gSDE with sample freq 4,
  log_std_init −2, no orthogonal init, GELU, pi/vf [256], reward-only VecNormalize). Pixel
  drawing dominates: ~44 agent steps/s on 2 cores, i.e. many HOURS of CPU (4M steps ≈ a day).

A trained folder holds ``model.zip``, ``vecnormalize.pkl`` (VecNormalize statistics),
``config.json`` (:class:`PPOConfig`), ``tensorboard/`` and, with evaluation on, ``best/`` (the
best evaluated model, itself a loadable ``ppo:DIR/best`` folder).
"""

from __future__ import annotations

import functools
import json
import pickle
import sys
import zipfile
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import cv2
import gymnasium as gym
import numpy as np

from nsacdrive.agents.rollout import pedal_to_car_action
from nsacdrive.common.progress import is_terminal
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS, make_car_racing
from nsacdrive.envs.state import STATE_FIELDS, PrivilegedState, privileged_state

OBS_KINDS = ("state", "pixels")
MODEL_FILE = "model.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
CONFIG_FILE = "config.json"
PIXEL_SIZE = 64
#: Offset of evaluation-env seeds from the training seed (separate track streams).
EVAL_SEED_OFFSET = 10_000


class PrivilegedStateObservation(gym.ObservationWrapper):
    """Replace the (render-free, all-zero) frame by the privileged state vector."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(len(STATE_FIELDS),), dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return privileged_state(self.env).as_vector()


def pixel_frame(observation: np.ndarray) -> np.ndarray:
    """96×96×3 RGB → 64×64×1 uint8 grey (the zoo's ResizeObservation + GrayscaleObservation)."""
    grey = cv2.cvtColor(np.ascontiguousarray(observation), cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (PIXEL_SIZE, PIXEL_SIZE), interpolation=cv2.INTER_AREA)[:, :, None]


class PixelObservation(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, shape=(PIXEL_SIZE, PIXEL_SIZE, 1), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return pixel_frame(observation)


class FrameSkip(gym.Wrapper):
    """Repeat each action ``skip`` times and sum the rewards (rl_zoo3.wrappers.FrameSkip)."""

    def __init__(self, env: gym.Env, skip: int = 2) -> None:
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        total = 0.0
        for _ in range(self.skip):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info


class PedalAction(gym.ActionWrapper):
    """Policy actions (steer, pedal) ∈ [−1, 1]² → CarRacing's (steer, gas = max(pedal, 0), brake = max(−pedal, 0))."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def action(self, action: np.ndarray) -> np.ndarray:
        return pedal_to_car_action(action)


class OffRoadTermination(gym.Wrapper):
    """End a training episode after ``patience`` consecutive steps off the road (|lateral error| >
    half the road width), adding ``penalty`` to that step's reward. Observations are state vectors."""

    LATERAL = STATE_FIELDS.index("lateral_error")

    def __init__(self, env: gym.Env, patience: int, penalty: float) -> None:
        super().__init__(env)
        self.patience, self.penalty, self.off_road = patience, penalty, 0

    def reset(self, **kwargs):
        self.off_road = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        off = abs(float(observation[self.LATERAL])) > self.env.unwrapped.geometry.half_width
        self.off_road = self.off_road + 1 if off else 0
        if self.off_road >= self.patience and not (terminated or truncated):
            terminated, reward = True, float(reward) - self.penalty
            info = {**info, "off_road_termination": True}
        return observation, reward, terminated, truncated, info


def make_state_env(seed: int | None = None, max_episode_steps: int = MAX_EPISODE_STEPS, frame_skip: int = 1,
                   pedal_action: bool = False, off_road_patience: int = 0, off_road_penalty: float = 0.0) -> gym.Env:
    """Render-free CarRacing whose observations are privileged state vectors (options: see :class:`PPOConfig`)."""
    env: gym.Env = PrivilegedStateObservation(make_car_racing(render_observations=False, max_episode_steps=max_episode_steps))
    if off_road_patience > 0:
        env = OffRoadTermination(env, off_road_patience, off_road_penalty)
    if frame_skip > 1:
        env = FrameSkip(env, frame_skip)
    if pedal_action:
        env = PedalAction(env)
    if seed is not None:
        env.reset(seed=seed)
    return env


def make_pixel_env(seed: int | None = None, max_episode_steps: int = MAX_EPISODE_STEPS, frame_skip: int = 2) -> gym.Env:
    """The zoo's pixel env (before VecFrameStack): fast renderer, frame skip, 64×64 grey."""
    env = PixelObservation(FrameSkip(make_car_racing(max_episode_steps=max_episode_steps, renderer="fast"), frame_skip))
    if seed is not None:
        env.reset(seed=seed)
    return env


@dataclass
class PPOConfig:
    """Everything that defines a PPO training run; stored as ``config.json`` beside the model."""

    obs: str = "state"
    timesteps: int = 1_000_000
    n_envs: int = 2
    seed: int = 0
    eval_freq: int = 25_000  # env steps between evaluations (0 = no evaluation)
    eval_episodes: int = 5
    max_episode_steps: int = MAX_EPISODE_STEPS
    n_steps: int = 512
    batch_size: int = 128
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    learning_rate: float = 3e-4
    linear_lr: bool = False  # decay the learning rate linearly to 0
    ent_coef: float = 0.0
    clip_range: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    net_arch: list[int] = field(default_factory=lambda: [256, 256])
    log_std_init: float = -1.0
    activation: str = "tanh"  # tanh | relu | gelu
    ortho_init: bool = True
    use_sde: bool = False
    sde_sample_freq: int = -1
    norm_obs: bool = True
    norm_reward: bool = True
    frame_stack: int = 1
    frame_skip: int = 1
    pedal_action: bool = False  # state: one signed pedal axis (PedalAction)
    off_road_patience: int = 0  # state, training envs only: end after this many steps off the road (0 = never)
    off_road_penalty: float = 0.0  # ... with this subtracted from the reward
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if self.obs not in OBS_KINDS:
            raise ValueError(f"obs must be one of {OBS_KINDS}, got {self.obs!r}")
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "max_episode_steps", "frame_stack", "frame_skip"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_freq < 0 or self.eval_episodes < 1:
            raise ValueError("eval_freq must be >= 0 and eval_episodes >= 1")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        self.net_arch = [int(n) for n in self.net_arch]

    @classmethod
    def state_recipe(cls, **overrides: Any) -> PPOConfig:
        """PPO on the privileged state: pedal axis, decisions held 2 steps, off-road termination in training."""
        recipe: dict[str, Any] = dict(obs="state", frame_skip=2, pedal_action=True, off_road_patience=25,
                                      off_road_penalty=20.0, n_steps=1024, batch_size=256, gamma=0.99)
        recipe.update(overrides)
        return cls(**recipe)

    @classmethod
    def pixels_recipe(cls, **overrides: Any) -> PPOConfig:
        """rl-baselines3-zoo's CarRacing-v3 PPO hyperparameters (hours of CPU; see module docstring)."""
        recipe: dict[str, Any] = dict(
            obs="pixels", timesteps=4_000_000, n_envs=8, n_steps=512, batch_size=128, n_epochs=10,
            gamma=0.99, gae_lambda=0.95, learning_rate=1e-4, linear_lr=True, ent_coef=0.0, clip_range=0.2,
            net_arch=[256], log_std_init=-2.0, activation="gelu", ortho_init=False, use_sde=True,
            sde_sample_freq=4, norm_obs=False, norm_reward=True, frame_stack=2, frame_skip=2,
        )
        recipe.update(overrides)
        return cls(**recipe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PPOConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _activations() -> dict[str, Any]:
    import torch.nn as nn

    return {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


_ACTIVATIONS = ("tanh", "relu", "gelu")


def _env_factory(config: PPOConfig, training: bool):
    if config.obs == "state":
        patience = config.off_road_patience if training else 0
        return functools.partial(make_state_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip,
                                 pedal_action=config.pedal_action, off_road_patience=patience,
                                 off_road_penalty=config.off_road_penalty)
    return functools.partial(make_pixel_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip)


def _vec_env(config: PPOConfig, seed: int, n_envs: int, training: bool = True):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    vec_cls = SubprocVecEnv if n_envs > 1 else DummyVecEnv
    kwargs = {"start_method": "forkserver"} if n_envs > 1 else None
    venv = make_vec_env(_env_factory(config, training), n_envs=n_envs, seed=seed, vec_env_cls=vec_cls, vec_env_kwargs=kwargs)
    if config.frame_stack > 1:
        venv = VecFrameStack(venv, config.frame_stack)
    return venv


def _progress_bar_available() -> bool:
    try:
        import rich  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def _new_best_saver(best_dir: Path, config: PPOConfig):
    from stable_baselines3.common.callbacks import BaseCallback

    class SaveBest(BaseCallback):
        """Runs on each new best evaluation: store model, statistics and config as a ``ppo:`` folder."""

        def _on_step(self) -> bool:
            self.model.save(str(best_dir / MODEL_FILE))
            vecnorm = self.model.get_vec_normalize_env()
            if vecnorm is not None:
                vecnorm.save(str(best_dir / VECNORMALIZE_FILE))
            (best_dir / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2))
            return True

    return SaveBest()


def train_ppo(config: PPOConfig, out_dir: str | Path, resume: bool = False, log=print):
    """Train (or with ``resume`` continue) PPO into ``out_dir``; returns the model.

    On resume the saved ``config.json`` wins except for ``timesteps`` (steps to ADD) and
    ``progress_bar``; ``obs`` must match.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.utils import get_linear_fn
    from stable_baselines3.common.vec_env import VecNormalize

    out = Path(out_dir)
    if resume:
        saved = load_config(out)
        if saved.obs != config.obs:
            raise ValueError(f"--resume: {out / CONFIG_FILE} was trained with obs={saved.obs!r}, not {config.obs!r}")
        saved.timesteps, saved.progress_bar = config.timesteps, config.progress_bar
        config = saved
        _check_file(out / MODEL_FILE, "a PPO model saved by `nsacdrive expert train`")
        _check_file(out / VECNORMALIZE_FILE, "VecNormalize statistics saved beside model.zip")
    elif (out / MODEL_FILE).exists():
        raise FileExistsError(f"{out / MODEL_FILE} exists: pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)

    venv = _vec_env(config, config.seed, config.n_envs)
    if resume:
        venv = VecNormalize.load(str(out / VECNORMALIZE_FILE), venv)
        venv.training = True
        model = PPO.load(str(out / MODEL_FILE), env=venv, device="cpu", tensorboard_log=str(out / "tensorboard"))
    else:
        venv = VecNormalize(venv, norm_obs=config.norm_obs, norm_reward=config.norm_reward, gamma=config.gamma)
        policy_kwargs = dict(
            net_arch=dict(pi=list(config.net_arch), vf=list(config.net_arch)),
            log_std_init=config.log_std_init,
            activation_fn=_activations()[config.activation],
            ortho_init=config.ortho_init,
        )
        model = PPO(
            "MlpPolicy" if config.obs == "state" else "CnnPolicy",
            venv,
            n_steps=config.n_steps,
            batch_size=config.batch_size,
            n_epochs=config.n_epochs,
            gamma=config.gamma,
            gae_lambda=config.gae_lambda,
            learning_rate=get_linear_fn(config.learning_rate, 0.0, 1.0) if config.linear_lr else config.learning_rate,
            ent_coef=config.ent_coef,
            clip_range=config.clip_range,
            vf_coef=config.vf_coef,
            max_grad_norm=config.max_grad_norm,
            use_sde=config.use_sde,
            sde_sample_freq=config.sde_sample_freq,
            policy_kwargs=policy_kwargs,
            tensorboard_log=str(out / "tensorboard"),
            seed=config.seed,
            device="cpu",
            verbose=0,
        )
    (out / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2))

    callbacks = []
    eval_env = None
    if config.eval_freq > 0:
        best_dir = out / "best"
        best_dir.mkdir(exist_ok=True)
        eval_env = VecNormalize(_vec_env(config, config.seed + EVAL_SEED_OFFSET, 1, training=False), norm_obs=config.norm_obs,
                                norm_reward=False, training=False, gamma=config.gamma)
        callbacks.append(EvalCallback(
            eval_env,
            n_eval_episodes=config.eval_episodes,
            eval_freq=max(1, config.eval_freq // config.n_envs),
            log_path=str(out / "eval"),
            deterministic=True,
            callback_on_new_best=_new_best_saver(best_dir, config),
            verbose=0,
        ))
    available = _progress_bar_available()
    progress_bar = config.progress_bar and available and is_terminal(sys.stdout)
    if config.progress_bar and not available:
        log("progress bar off: it needs both tqdm and rich installed")
    elif config.progress_bar and not progress_bar:
        log("progress bar off: output is not a terminal")
    try:
        model.learn(total_timesteps=config.timesteps, callback=callbacks or None, progress_bar=progress_bar,
                    reset_num_timesteps=not resume, tb_log_name="PPO")
    finally:  # keep what was learnt even on Ctrl-C
        model.save(str(out / MODEL_FILE))
        venv.save(str(out / VECNORMALIZE_FILE))
        venv.close()
        if eval_env is not None:
            eval_env.close()
    return model


def _check_file(path: Path, expected: str) -> None:
    if not path.is_file():
        raise ValueError(f"{path} is missing: expected {expected}")


def load_config(folder: str | Path) -> PPOConfig:
    path = Path(folder) / CONFIG_FILE
    _check_file(path, "the PPOConfig JSON written by `nsacdrive expert train`")
    try:
        return PPOConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a valid PPO config ({exc})") from None


class PPOAgent:
    """Drives with a PPO model trained by :func:`train_ppo` (deterministic actions).

    State policies read the privileged state (normalised with the saved, frozen VecNormalize
    statistics); pixel policies read the raw frame and keep the last ``frame_stack`` decision
    frames like the training envs did. Each action is held ``frame_skip`` steps, and a pedal-axis
    policy's (steer, pedal) becomes (steer, gas, brake), as in training.
    """

    source = "ppo"

    def __init__(self, folder: str | Path) -> None:
        from stable_baselines3 import PPO

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"ppo: {self.folder} is not a folder: expected a folder written by `nsacdrive expert train`")
        self.cfg = load_config(self.folder)
        model_path = self.folder / MODEL_FILE
        vecnorm_path = self.folder / VECNORMALIZE_FILE
        _check_file(model_path, "a PPO model saved by `nsacdrive expert train`")
        _check_file(vecnorm_path, "VecNormalize statistics saved beside model.zip")
        if not zipfile.is_zipfile(model_path):
            raise ValueError(f"{model_path} is corrupt: expected a Stable-Baselines3 model zip")
        constant = lambda _: 0.0  # noqa: E731  (schedules are only needed for training)
        try:
            self.model = PPO.load(str(model_path), device="cpu",
                                  custom_objects={"learning_rate": 0.0, "lr_schedule": constant, "clip_range": constant})
        except Exception as exc:  # SB3 raises many kinds on damaged archives
            raise ValueError(f"{model_path} is corrupt: expected a Stable-Baselines3 PPO model ({type(exc).__name__}: {exc})") from None
        try:
            with open(vecnorm_path, "rb") as handle:
                self.vecnorm = pickle.load(handle)
        except Exception as exc:
            raise ValueError(f"{vecnorm_path} is corrupt: expected pickled VecNormalize statistics ({type(exc).__name__}: {exc})") from None
        if not hasattr(self.vecnorm, "normalize_obs"):
            raise ValueError(f"{vecnorm_path} is not VecNormalize statistics (got {type(self.vecnorm).__name__})")
        self.vecnorm.training = False
        expected = (len(STATE_FIELDS),) if self.cfg.obs == "state" else (PIXEL_SIZE, PIXEL_SIZE, self.cfg.frame_stack)
        if tuple(self.model.observation_space.shape) != expected:
            raise ValueError(f"{model_path}: observation shape {self.model.observation_space.shape} does not match "
                             f"obs={self.cfg.obs!r} in {CONFIG_FILE} (expected {expected})")
        self.agent_id = f"ppo-{self.cfg.obs}"
        self.needs_pixels = self.cfg.obs == "pixels"
        self._low = self.model.action_space.low.astype(np.float32)
        self._high = self.model.action_space.high.astype(np.float32)
        self.reset()

    def reset(self) -> None:
        self._frames: deque[np.ndarray] = deque(maxlen=self.cfg.frame_stack)
        self._step = 0
        self._last_action: np.ndarray | None = None

    def config(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "model_dir": str(self.folder), "obs": self.cfg.obs,
                "num_timesteps": int(self.model.num_timesteps)}

    def _policy_input(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        if self.cfg.obs == "state":
            return state.as_vector()[None]
        frame = pixel_frame(observation)
        if not self._frames:  # VecFrameStack starts from zeros
            self._frames.extend(np.zeros_like(frame) for _ in range(self.cfg.frame_stack))
        self._frames.append(frame)
        return np.concatenate(list(self._frames), axis=-1)[None]

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        repeat = self._last_action is not None and self._step % self.cfg.frame_skip != 0
        self._step += 1
        if repeat:
            return self._last_action.copy()
        policy_input = self._policy_input(observation, state)
        if self.cfg.norm_obs:
            policy_input = self.vecnorm.normalize_obs(policy_input)
        action, _ = self.model.predict(policy_input, deterministic=True)
        action = np.asarray(action, dtype=np.float32).reshape(-1)
        self._last_action = pedal_to_car_action(action) if self.cfg.pedal_action else np.clip(action, self._low, self._high)
        return self._last_action.copy()
