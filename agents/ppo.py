"""Stable-Baselines3 PPO experts: training (``nsacdrive expert train``) and the ``ppo:DIR`` agent.

Two observation kinds:

- ``state``: the privileged state vector (:data:`nsacdrive.envs.state.STATE_FIELDS`, float32, or
  the subset ``state_fields`` names) from a render-free env, read once per decision, so training
  runs at physics speed (the policy's updates run on one thread: for a small MLP that is
  fastest). VecNormalize normalises observations and rewards. :meth:`PPOConfig.state_recipe`
  reads only the fields a student's camera shows and shapes the control problem: one signed
  pedal axis instead of gas and brake (a Gaussian policy over both presses them together
  and the car crawls) and each decision held for 2 physics steps. In the TRAINING envs only it
  shapes the reward too: an episode ends with a penalty after a stretch off the road (no time
  wasted on grass), leaving the centreline costs a little each decision, each road tile
  driven past untouched costs more (CarRacing ends a lap only once every tile is touched), and
  changing the action costs in proportion to the change (a jittery teacher is hard to imitate).
  Evaluation envs are plain CarRacing: the score is never shaped.
- ``pixels``: rl-baselines3-zoo's CarRacing-v3 PPO recipe (frame skip 2, 64×64 grey, frame stack 2,
  8 envs, 4M steps, n_steps 512, batch 128, 10 epochs, linear lr 1e-4, gSDE with sample freq 4,
  log_std_init −2, no orthogonal init, GELU, pi/vf [256], reward-only VecNormalize). Pixel
  drawing dominates: ~44 agent steps/s on 2 cores, i.e. many HOURS of CPU (4M steps ≈ a day).

A trained folder holds:

- ``policy.safetensors`` (the policy network's weights) and ``policy.json`` (how to rebuild the
  network: observation and action spaces, architecture, the frozen VecNormalize observation
  statistics, the weights' sha256). With ``config.json`` they are all that ``ppo:DIR`` reads.
- ``model.zip`` (the SB3 model with its optimiser state) and ``vecnormalize.pkl`` (the
  VecNormalize wrapper, reward statistics included): what ``nsacdrive expert train --resume``
  continues from.
- ``config.json`` (:class:`PPOConfig`), ``tensorboard/`` and, with evaluation on, ``eval/`` (the
  learning curve: ``curve.json`` and ``curve.png``, :mod:`nsacdrive.agents.ppo_curve`) and ``best/``
  (the best evaluated model: most laps, then the highest score; itself a ``ppo:DIR/best`` folder).

:mod:`nsacdrive.agents.ppo_policy` writes and reads the two policy files. Every save writes each
file atomically (at the end of training, after Ctrl-C, and into ``best/``).
``model.zip`` and ``vecnormalize.pkl`` are pickles (SB3 stores parts of the model with cloudpickle):
loading them executes whatever code they carry. So ``expert train --resume`` and ``expert export``
(which writes the two policy files for a folder trained before they existed) are only for folders
you made yourself; driving never opens them (docs/security.md).
"""

from __future__ import annotations

import functools
import io
import json
import pickle
import sys
import zipfile
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.agents.ppo_config import PPOConfig
from nsacdrive.agents.ppo_curve import new_curve_recorder
from nsacdrive.agents.ppo_envs import LapSuccess, make_pixel_env, make_state_env, pixel_frame
from nsacdrive.agents.ppo_policy import (
    CONFIG_FILE,
    MODEL_FILE,
    POLICY_FILE,
    VECNORMALIZE_FILE,
    activation_classes,
    check_file,
    load_exported_policy,
    write_policy,
)
from nsacdrive.agents.rollout import pedal_to_car_action
from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.common.progress import is_terminal
from nsacdrive.envs.state import PrivilegedState, state_columns

#: Offset of evaluation-env seeds from the training seed (separate track streams).
EVAL_SEED_OFFSET = 10_000


def env_factory(config: PPOConfig, training: bool):
    """A function making one env of ``config``: reward shaping only when ``training``."""
    if config.obs == "state":
        shaping = dict(off_road_patience=config.off_road_patience, off_road_penalty=config.off_road_penalty,
                       centre_penalty=config.centre_penalty, missed_tile_penalty=config.missed_tile_penalty,
                       action_change_penalty=config.action_change_penalty, action_noise=config.action_noise) if training else {}
        return functools.partial(make_state_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip,
                                 pedal_action=config.pedal_action, state_fields=config.state_fields, **shaping)
    return functools.partial(make_pixel_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip)


def vec_envs(config: PPOConfig, seed: int, n_envs: int, training: bool = True):
    """``n_envs`` seeded envs of ``config`` (subprocesses when more than one); evaluation envs count laps."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, VecTransposeImage

    vec_cls = SubprocVecEnv if n_envs > 1 else DummyVecEnv
    kwargs = {"start_method": "forkserver"} if n_envs > 1 else None
    venv = make_vec_env(env_factory(config, training), n_envs=n_envs, seed=seed, vec_env_cls=vec_cls, vec_env_kwargs=kwargs,
                        wrapper_class=None if training else LapSuccess)
    if config.frame_stack > 1:
        venv = VecFrameStack(venv, config.frame_stack)
    if config.obs == "pixels":  # channels first below VecNormalize, so training and evaluation envs wrap alike
        venv = VecTransposeImage(venv)  # (left to SB3, the training env alone gets it on top and syncing statistics fails)
    return venv


def _progress_bar_available() -> bool:
    try:
        import rich  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def _save_folder(model, folder: Path, config: PPOConfig) -> None:
    """Write every file of a PPO folder, each atomically: what resuming needs (model.zip,
    vecnormalize.pkl), config.json, and what driving needs (policy.safetensors, policy.json)."""
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is None:
        raise ValueError("PPO folders are written from models trained inside VecNormalize")
    buffer = io.BytesIO()
    model.save(buffer)
    atomic_write_bytes(folder / MODEL_FILE, buffer.getvalue())
    atomic_write_bytes(folder / VECNORMALIZE_FILE, pickle.dumps(vecnorm))  # what VecNormalize.save writes
    atomic_write_json(folder / CONFIG_FILE, asdict(config))
    write_policy(model.policy, vecnorm, int(model.num_timesteps), folder)


def new_penalty_ramp(warmup: int) -> Any:
    """An SB3 callback that, before each rollout, scales the training envs' action-change penalty
    to ``num_timesteps / warmup`` (at most 1): early exploration is not charged for jitter. It
    reads the model's clock, so a resumed training continues the ramp."""
    from stable_baselines3.common.callbacks import BaseCallback

    class PenaltyRamp(BaseCallback):
        def _on_rollout_start(self) -> None:
            self.training_env.env_method("scale_action_change_penalty", self.model.num_timesteps / warmup)

        def _on_step(self) -> bool:
            return True

    return PenaltyRamp()


def train_ppo(config: PPOConfig, out_dir: str | Path, resume: bool = False, log=print):
    """Train (or with ``resume`` continue) PPO into ``out_dir``; returns the model.

    On resume the saved ``config.json`` wins except for ``timesteps`` (steps to ADD),
    ``progress_bar`` and ``device`` (where this machine runs it); ``obs`` must match. Resuming
    loads ``model.zip`` and ``vecnormalize.pkl``, pickles that can execute code: resume only
    folders you made yourself.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.utils import LinearSchedule
    from stable_baselines3.common.vec_env import VecNormalize

    out = Path(out_dir)
    if resume:
        saved = load_config(out)
        if saved.obs != config.obs:
            raise ValueError(f"--resume: {out / CONFIG_FILE} was trained with obs={saved.obs!r}, not {config.obs!r}")
        config = replace(saved, timesteps=config.timesteps, progress_bar=config.progress_bar, device=config.device)
        _check_resumable(out)
    elif (out / MODEL_FILE).exists():
        raise FileExistsError(f"{out / MODEL_FILE} exists: pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if config.obs == "state":  # a small MLP: one thread runs its updates fastest and leaves the other cores to the envs
        torch.set_num_threads(1)

    venv = vec_envs(config, config.seed, config.n_envs)
    if resume:
        venv = VecNormalize.load(str(out / VECNORMALIZE_FILE), venv)
        venv.training = True
        model = PPO.load(str(out / MODEL_FILE), env=venv, device=config.device, tensorboard_log=str(out / "tensorboard"))
    else:
        venv = VecNormalize(venv, norm_obs=config.norm_obs, norm_reward=config.norm_reward, gamma=config.gamma)
        policy_kwargs = dict(
            net_arch=dict(pi=list(config.net_arch), vf=list(config.net_arch)),
            log_std_init=config.log_std_init,
            activation_fn=activation_classes()[config.activation],
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
            learning_rate=LinearSchedule(config.learning_rate, 0.0, 1.0) if config.linear_lr else config.learning_rate,
            ent_coef=config.ent_coef,
            clip_range=config.clip_range,
            vf_coef=config.vf_coef,
            max_grad_norm=config.max_grad_norm,
            use_sde=config.use_sde,
            sde_sample_freq=config.sde_sample_freq,
            policy_kwargs=policy_kwargs,
            tensorboard_log=str(out / "tensorboard"),
            seed=config.seed,
            device=config.device,
            verbose=0,
        )
    atomic_write_json(out / CONFIG_FILE, asdict(config))

    ramp = config.action_change_warmup > 0 and config.action_change_penalty > 0
    callbacks = [new_penalty_ramp(config.action_change_warmup)] if ramp else []
    eval_env = None
    if config.eval_freq > 0:
        best_dir = out / "best"
        best_dir.mkdir(exist_ok=True)
        eval_env = VecNormalize(vec_envs(config, config.seed + EVAL_SEED_OFFSET, 1, training=False), norm_obs=config.norm_obs,
                                norm_reward=False, training=False, gamma=config.gamma)
        callbacks.append(EvalCallback(
            eval_env,
            n_eval_episodes=config.eval_episodes,
            eval_freq=max(1, config.eval_freq // config.n_envs),
            log_path=str(out / "eval"),  # without it EvalCallback keeps no per-episode results for the curve
            deterministic=True,
            callback_after_eval=new_curve_recorder(out / "eval", lambda: _save_folder(model, best_dir, config)),
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
        _save_folder(model, out, config)
        venv.close()
        if eval_env is not None:
            eval_env.close()
    return model


def export_policy(folder: str | Path) -> Path:
    """Write ``policy.safetensors`` and ``policy.json`` of a folder trained before driving read them;
    returns the path of ``policy.json``.

    It loads ``model.zip`` and ``vecnormalize.pkl``, pickles that can execute code: export only
    folders you made yourself.
    """
    from stable_baselines3 import PPO

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder: expected a folder written by `nsacdrive expert train`")
    load_config(folder)
    model_path, vecnorm_path = _check_resumable(folder)
    if not zipfile.is_zipfile(model_path):
        raise ValueError(f"{model_path} is corrupt: expected a Stable-Baselines3 model zip")
    constant = lambda _: 0.0  # noqa: E731  (schedules are only needed for training)
    try:
        model = PPO.load(str(model_path), device="cpu",
                         custom_objects={"learning_rate": 0.0, "lr_schedule": constant, "clip_range": constant})
    except Exception as exc:  # SB3 raises many kinds on damaged archives
        raise ValueError(f"{model_path} is corrupt: expected a Stable-Baselines3 PPO model ({type(exc).__name__}: {exc})") from None
    try:
        with open(vecnorm_path, "rb") as handle:
            vecnorm = pickle.load(handle)
    except Exception as exc:
        raise ValueError(f"{vecnorm_path} is corrupt: expected pickled VecNormalize statistics ({type(exc).__name__}: {exc})") from None
    if not hasattr(vecnorm, "norm_obs"):
        raise ValueError(f"{vecnorm_path} is not VecNormalize statistics (got {type(vecnorm).__name__})")
    write_policy(model.policy, vecnorm, int(model.num_timesteps), folder)
    return folder / POLICY_FILE


def _check_resumable(folder: Path) -> tuple[Path, Path]:
    """The paths of ``folder``'s model.zip and vecnormalize.pkl, after checking both are there."""
    model_path, vecnorm_path = folder / MODEL_FILE, folder / VECNORMALIZE_FILE
    check_file(model_path, "a PPO model saved by `nsacdrive expert train`")
    check_file(vecnorm_path, "VecNormalize statistics saved beside model.zip")
    return model_path, vecnorm_path


def load_config(folder: str | Path) -> PPOConfig:
    path = Path(folder) / CONFIG_FILE
    check_file(path, "the PPOConfig JSON written by `nsacdrive expert train`")
    try:
        return PPOConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a valid PPO config ({exc})") from None


class PPOAgent:
    """Drives with a PPO policy trained by :func:`train_ppo` (deterministic actions).

    It reads only ``config.json``, ``policy.json`` and ``policy.safetensors``: never model.zip or
    vecnormalize.pkl, whose pickles could execute code. State policies read the privileged state
    (normalised with the saved, frozen VecNormalize statistics); pixel policies read the raw frame
    and keep the last ``frame_stack`` decision frames like the training envs did. Each action is
    held ``frame_skip`` steps, and a pedal-axis policy's (steer, pedal) becomes (steer, gas,
    brake), as in training.
    """

    source = "ppo"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"ppo: {self.folder} is not a folder: expected a folder written by `nsacdrive expert train`")
        self.cfg = load_config(self.folder)
        self.columns = state_columns(self.cfg.state_fields)
        self.exported = load_exported_policy(self.folder, self.cfg)
        self.agent_id = f"ppo-{self.cfg.obs}"
        self.needs_pixels = self.cfg.obs == "pixels"
        self.reset()

    def reset(self) -> None:
        self._frames: deque[np.ndarray] = deque(maxlen=self.cfg.frame_stack)
        self._step = 0
        self._last_action: np.ndarray | None = None

    def config(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "model_dir": str(self.folder), "obs": self.cfg.obs,
                "num_timesteps": self.exported.num_timesteps}

    def _policy_input(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        if self.cfg.obs == "state":
            return state.as_vector()[self.columns]
        frame = pixel_frame(observation)
        if not self._frames:  # VecFrameStack starts from zeros
            self._frames.extend(np.zeros_like(frame) for _ in range(self.cfg.frame_stack))
        self._frames.append(frame)
        return np.concatenate(list(self._frames), axis=-1)

    def decide(self, policy_input: np.ndarray) -> np.ndarray:
        """The policy's deterministic action (float32, within its action space) for one raw policy
        input: what the trained SB3 model predicts for the VecNormalize-normalised input."""
        batch = np.asarray(policy_input)[None]
        if self.exported.normalization is not None:
            batch = self.exported.normalization(batch)
        action, _ = self.exported.policy.predict(batch, deterministic=True)
        return np.asarray(action, dtype=np.float32).reshape(-1)

    def label_state(self, state: PrivilegedState) -> np.ndarray:
        """A fresh (steer, gas, brake) decision for any privileged state, leaving the held decision
        alone: how a state policy labels states the car never drove (side cameras)."""
        if self.cfg.obs != "state":
            raise ValueError(f"ppo: {self.folder} reads pixels: only a state policy labels a state it has no frames of")
        return self._car_action(self.decide(state.as_vector()[self.columns]))

    def _car_action(self, action: np.ndarray) -> np.ndarray:
        """The policy's action as CarRacing's (steer, gas, brake)."""
        return pedal_to_car_action(action) if self.cfg.pedal_action else action

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        repeat = self._last_action is not None and self._step % self.cfg.frame_skip != 0
        self._step += 1
        if repeat:
            return self._last_action.copy()
        action = self.decide(self._policy_input(observation, state))
        self._last_action = self._car_action(action)
        return self._last_action.copy()
