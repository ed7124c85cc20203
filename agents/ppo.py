"""Stable-Baselines3 PPO experts: training (``nsacdrive expert train``) and the ``ppo:DIR`` agent.

Two observation kinds:

- ``state``: the privileged state vector (:data:`nsacdrive.envs.state.STATE_FIELDS`, float32) from a
  render-free env, read once per decision, so training runs at physics speed (the policy's
  updates run on one thread: for a small MLP that is fastest). VecNormalize normalises
  observations and rewards. :meth:`PPOConfig.state_recipe` shapes the control problem: one
  signed pedal axis instead of gas and brake (a Gaussian policy over both presses them together
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

Every save writes each file atomically (at the end of training, after Ctrl-C, and into ``best/``).
``model.zip`` and ``vecnormalize.pkl`` are pickles (SB3 stores parts of the model with cloudpickle):
loading them executes whatever code they carry. So ``expert train --resume`` and ``expert export``
(which writes the two policy files for a folder trained before they existed) are only for folders
you made yourself; driving never opens them (docs/security.md).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import pickle
import sys
import zipfile
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from nsacdrive.agents.ppo_curve import new_curve_recorder
from nsacdrive.agents.ppo_envs import PIXEL_SIZE, LapSuccess, make_pixel_env, make_state_env, pixel_frame
from nsacdrive.agents.rollout import pedal_to_car_action
from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.common.config_checks import AT_LEAST_ONE, NON_NEGATIVE, check_ranges
from nsacdrive.common.progress import is_terminal
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS
from nsacdrive.envs.state import STATE_FIELDS, PrivilegedState

OBS_KINDS = ("state", "pixels")
MODEL_FILE = "model.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
CONFIG_FILE = "config.json"
POLICY_WEIGHTS_FILE = "policy.safetensors"
POLICY_FILE = "policy.json"
POLICY_FORMAT = "nsacdrive-ppo-policy"
POLICY_FORMAT_VERSION = 1
#: Offset of evaluation-env seeds from the training seed (separate track streams).
EVAL_SEED_OFFSET = 10_000


#: the numbers PPOConfig's numeric fields may take (``eval_freq`` 0: no evaluation)
PPO_RANGES = {**dict.fromkeys(("timesteps", "n_envs", "eval_episodes", "max_episode_steps", "n_steps", "batch_size", "n_epochs",
                               "frame_stack", "frame_skip"), AT_LEAST_ONE),
              **dict.fromkeys(("eval_freq", "off_road_penalty", "centre_penalty", "missed_tile_penalty", "action_change_penalty"),
                             NON_NEGATIVE)}


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
    off_road_patience: int = 0  # state, training envs only: end after this many decisions off the road (0 = never)
    off_road_penalty: float = 0.0  # ... with this subtracted from the reward
    centre_penalty: float = 0.0  # state, training envs only: minus this × |lateral error| per decision
    missed_tile_penalty: float = 0.0  # state, training envs only: minus this for each tile driven past untouched
    action_change_penalty: float = 0.0  # state, training envs only: minus this × |Δ action| (L1) per decision
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if self.obs not in OBS_KINDS:
            raise ValueError(f"obs must be one of {OBS_KINDS}, got {self.obs!r}")
        check_ranges(self, "PPO config", PPO_RANGES)
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        self.net_arch = [int(n) for n in self.net_arch]

    @classmethod
    def state_recipe(cls, **overrides: Any) -> PPOConfig:
        """PPO on the privileged state: pedal axis, decisions held 2 steps, a long discount, small initial
        exploration, an annealed learning rate and, in training envs only, off-road termination and
        penalties for leaving the centreline, for driving past a tile untouched and for changing
        the action (smooth labels are what a student can imitate); best/ by laps."""
        recipe: dict[str, Any] = dict(obs="state", timesteps=600_000, frame_skip=2, pedal_action=True, off_road_patience=13,
                                      off_road_penalty=20.0, centre_penalty=0.1, missed_tile_penalty=25.0,
                                      action_change_penalty=3.0, n_steps=1024,
                                      batch_size=256, gamma=0.995, log_std_init=-1.5, linear_lr=True, eval_freq=50_000,
                                      eval_episodes=20)
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
        shaping = dict(off_road_patience=config.off_road_patience, off_road_penalty=config.off_road_penalty,
                       centre_penalty=config.centre_penalty, missed_tile_penalty=config.missed_tile_penalty,
                       action_change_penalty=config.action_change_penalty) if training else {}
        return functools.partial(make_state_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip,
                                 pedal_action=config.pedal_action, **shaping)
    return functools.partial(make_pixel_env, max_episode_steps=config.max_episode_steps, frame_skip=config.frame_skip)


def _vec_env(config: PPOConfig, seed: int, n_envs: int, training: bool = True):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    vec_cls = SubprocVecEnv if n_envs > 1 else DummyVecEnv
    kwargs = {"start_method": "forkserver"} if n_envs > 1 else None
    venv = make_vec_env(_env_factory(config, training), n_envs=n_envs, seed=seed, vec_env_cls=vec_cls, vec_env_kwargs=kwargs,
                        wrapper_class=None if training else LapSuccess)
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
    _write_policy(model.policy, vecnorm, int(model.num_timesteps), folder)


def train_ppo(config: PPOConfig, out_dir: str | Path, resume: bool = False, log=print):
    """Train (or with ``resume`` continue) PPO into ``out_dir``; returns the model.

    On resume the saved ``config.json`` wins except for ``timesteps`` (steps to ADD) and
    ``progress_bar``; ``obs`` must match. Resuming loads ``model.zip`` and ``vecnormalize.pkl``,
    pickles that can execute code: resume only folders you made yourself.
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
        saved.timesteps, saved.progress_bar = config.timesteps, config.progress_bar
        config = saved
        _check_file(out / MODEL_FILE, "a PPO model saved by `nsacdrive expert train`")
        _check_file(out / VECNORMALIZE_FILE, "VecNormalize statistics saved beside model.zip")
    elif (out / MODEL_FILE).exists():
        raise FileExistsError(f"{out / MODEL_FILE} exists: pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if config.obs == "state":  # a small MLP: one thread runs its updates fastest and leaves the other cores to the envs
        torch.set_num_threads(1)

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
            device="cpu",
            verbose=0,
        )
    atomic_write_json(out / CONFIG_FILE, asdict(config))

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
    model_path, vecnorm_path = folder / MODEL_FILE, folder / VECNORMALIZE_FILE
    _check_file(model_path, "a PPO model saved by `nsacdrive expert train`")
    _check_file(vecnorm_path, "VecNormalize statistics saved beside model.zip")
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
    _write_policy(model.policy, vecnorm, int(model.num_timesteps), folder)
    return folder / POLICY_FILE


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


# --- The exported policy: policy.safetensors + policy.json, read without unpickling anything ---

_SPACE_DTYPES = ("float32", "float64", "uint8")


def _policy_classes() -> dict[str, Any]:
    from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy

    return {"ActorCriticPolicy": ActorCriticPolicy, "ActorCriticCnnPolicy": ActorCriticCnnPolicy}


def _features_extractors() -> dict[str, Any]:
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

    return {"FlattenExtractor": FlattenExtractor, "NatureCNN": NatureCNN}


def _name_of(cls: type, table: dict[str, Any], what: str) -> str:
    """The JSON name of ``cls`` in ``table`` (name → class); only these classes can be exported."""
    for name, known in table.items():
        if cls is known:
            return name
    raise ValueError(f"cannot export a policy with {what} {cls.__name__}: expected one of {', '.join(table)}")


def _canonical_names(state: dict[str, Any]) -> dict[str, str]:
    """Each state-dict entry → the first entry stored in the same memory: a shared features
    extractor appears under three names, and safetensors stores each tensor once."""
    first: dict[tuple, str] = {}
    return {name: first.setdefault((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()), name) for name, t in state.items()}


def _json_bound(values: np.ndarray) -> float | str | list[float | str]:
    """Box bounds as JSON: one number when every element is equal, else a flat list; ±inf as "inf"/"-inf"."""
    flat = [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]
    named = [v if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in flat]
    return named[0] if len(set(flat)) == 1 else named


def _json_box(space: gym.spaces.Box) -> dict[str, Any]:
    return {"shape": list(space.shape), "dtype": str(space.dtype), "low": _json_bound(space.low), "high": _json_bound(space.high)}


def _policy_description(policy) -> dict[str, Any]:
    """The constructor arguments of ``policy`` as JSON (what SB3 itself would pickle)."""
    dist = policy.dist_kwargs or {"full_std": True, "use_expln": False, "squash_output": False}
    return {
        "class": _name_of(type(policy), _policy_classes(), "policy class"),
        "net_arch": policy.net_arch,
        "activation_fn": _name_of(policy.activation_fn, _activations(), "activation"),
        "ortho_init": bool(policy.ortho_init),
        "use_sde": bool(policy.use_sde),
        "log_std_init": float(policy.log_std_init),
        "full_std": bool(dist["full_std"]),
        "use_expln": bool(dist["use_expln"]),
        "squash_output": bool(dist["squash_output"]),
        "features_extractor_class": _name_of(policy.features_extractor_class, _features_extractors(), "features extractor"),
        "features_extractor_kwargs": dict(policy.features_extractor_kwargs),
        "share_features_extractor": bool(policy.share_features_extractor),
        "normalize_images": bool(policy.normalize_images),
    }


def _normalization_description(vecnorm) -> dict[str, Any]:
    """VecNormalize's observation statistics as plain numbers (flat lists in C order)."""
    if not vecnorm.norm_obs:
        return {"norm_obs": False}
    rms = vecnorm.obs_rms
    if isinstance(rms, dict):
        raise ValueError("cannot export VecNormalize statistics of dict observations")
    return {"norm_obs": True, "mean": np.asarray(rms.mean, np.float64).ravel().tolist(),
            "var": np.asarray(rms.var, np.float64).ravel().tolist(), "epsilon": float(vecnorm.epsilon),
            "clip_obs": float(vecnorm.clip_obs)}


def _write_policy(policy, vecnorm, num_timesteps: int, folder: Path) -> None:
    """Write what ``ppo:DIR`` drives with: the weights (safetensors), then ``policy.json`` naming their sha256."""
    import safetensors.torch

    state = policy.state_dict()
    canonical = _canonical_names(state)
    weights = safetensors.torch.save({name: t.detach().contiguous() for name, t in state.items() if canonical[name] == name})
    atomic_write_bytes(folder / POLICY_WEIGHTS_FILE, weights)
    atomic_write_json(folder / POLICY_FILE, {
        "format": POLICY_FORMAT,
        "version": POLICY_FORMAT_VERSION,
        "num_timesteps": num_timesteps,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "policy": _policy_description(policy),
        "observation_space": _json_box(policy.observation_space),
        "action_space": _json_box(policy.action_space),
        "obs_normalization": _normalization_description(vecnorm),
    })


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class _JsonObject:
    """Typed access to one object of a JSON file; errors name the file, the field and what was expected."""

    path: Path
    data: dict[str, Any]
    prefix: str = ""

    def error(self, name: str, expected: str) -> ValueError:
        """The error for field ``name``: the file, the field, what was expected and what is there."""
        got = _short(self.data[name]) if name in self.data else "nothing (missing)"
        return ValueError(f"{self.path}: field {self.prefix + name!r} must be {expected}, got {got}")

    def get(self, name: str, kind: type | tuple[type, ...], expected: str) -> Any:
        """Field ``name``, which must be a ``kind`` (a bool is no number here)."""
        value = self.data.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(name, expected)
        return value

    def number(self, name: str) -> float:
        """Field ``name``, a finite number (Python's JSON reader takes NaN and Infinity; a policy must not)."""
        value = float(self.get(name, (int, float), "a finite number"))
        if not math.isfinite(value):
            raise self.error(name, "a finite number")
        return value

    def flag(self, name: str) -> bool:
        return self.get(name, bool, "true or false")

    def object(self, name: str) -> _JsonObject:
        return _JsonObject(self.path, self.get(name, dict, "a JSON object"), f"{self.prefix}{name}.")

    def choice(self, name: str, options: tuple[str, ...]) -> str:
        value = self.data.get(name)
        if value not in options:
            raise self.error(name, f"one of {', '.join(options)}")
        return value


#: bounds on what policy.json may ask to build, checked before anything is allocated: far above any
#: policy of this project, far below what would exhaust a machine's memory
MAX_LAYERS, MAX_WIDTH, MAX_SPACE_ELEMENTS = 64, 65_536, 1 << 20


def _layer_sizes(value: Any) -> bool:
    return (isinstance(value, list) and len(value) <= MAX_LAYERS
            and all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_WIDTH for n in value))


def _read_net_arch(obj: _JsonObject) -> list[int] | dict[str, list[int]]:
    value = obj.data.get("net_arch")
    if _layer_sizes(value) or (isinstance(value, dict) and set(value) == {"pi", "vf"} and all(map(_layer_sizes, value.values()))):
        return value
    raise obj.error("net_arch", "a list of layer sizes or {\"pi\": [...], \"vf\": [...]}")


def _read_policy_kwargs(obj: _JsonObject) -> dict[str, Any]:
    """The policy constructor's keyword arguments, classes looked up by name in closed tables."""
    extractor_kwargs = obj.object("features_extractor_kwargs")
    for key, value in extractor_kwargs.data.items():
        if not isinstance(value, (bool, int, float, str)) or (isinstance(value, (int, float)) and not abs(value) <= MAX_WIDTH):
            raise extractor_kwargs.error(key, f"a number of at most {MAX_WIDTH}, a string or true/false")
    return {
        "net_arch": _read_net_arch(obj),
        "activation_fn": _activations()[obj.choice("activation_fn", _ACTIVATIONS)],
        "ortho_init": obj.flag("ortho_init"),
        "use_sde": obj.flag("use_sde"),
        "log_std_init": obj.number("log_std_init"),
        "full_std": obj.flag("full_std"),
        "use_expln": obj.flag("use_expln"),
        "squash_output": obj.flag("squash_output"),
        "features_extractor_class": _features_extractors()[obj.choice("features_extractor_class", tuple(_features_extractors()))],
        "features_extractor_kwargs": extractor_kwargs.data,
        "share_features_extractor": obj.flag("share_features_extractor"),
        "normalize_images": obj.flag("normalize_images"),
    }


def _read_numbers(obj: _JsonObject, name: str, shape: tuple[int, ...], bound: bool) -> np.ndarray:
    """A float64 array of ``shape`` from a flat list of numbers in C order. A ``bound`` of a Box may
    also be one number for every element, and "inf" / "-inf" for infinite bounds."""
    value = obj.data.get(name)
    size = math.prod(shape)
    items = value if isinstance(value, list) else [value]
    numbers_ok = all((isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
                     or (bound and v in ("inf", "-inf")) for v in items)
    length_ok = len(items) == size if isinstance(value, list) else bound
    if not (numbers_ok and length_ok):
        expected = (f"a number or a list of {size} numbers (\"inf\" / \"-inf\" for infinite bounds)" if bound
                    else f"a list of {size} finite numbers")
        raise obj.error(name, expected)
    return np.broadcast_to(np.array([float(v) for v in items], dtype=np.float64), (size,)).reshape(shape).copy()


def _read_box(obj: _JsonObject) -> gym.spaces.Box:
    shape_list = obj.get("shape", list, "a list of positive sizes")
    if not _layer_sizes(shape_list) or not shape_list or math.prod(shape_list) > MAX_SPACE_ELEMENTS:
        raise obj.error("shape", f"a non-empty list of positive sizes of at most {MAX_SPACE_ELEMENTS} elements in all")
    shape = tuple(shape_list)
    dtype = obj.choice("dtype", _SPACE_DTYPES)
    low, high = (_read_numbers(obj, name, shape, bound=True) for name in ("low", "high"))
    if dtype.startswith("float"):  # gymnasium warns on float64 bounds of a float32 box
        low, high = low.astype(dtype), high.astype(dtype)
    try:
        return gym.spaces.Box(low, high, shape=shape, dtype=dtype)
    except (ValueError, TypeError, AssertionError) as exc:
        raise ValueError(f"{obj.path}: field {obj.prefix.rstrip('.')!r} is not a valid Box ({exc})") from None


@dataclass(frozen=True)
class ObsNormalization:
    """VecNormalize's frozen observation statistics, applied exactly as ``VecNormalize.normalize_obs``."""

    mean: np.ndarray
    var: np.ndarray
    epsilon: float
    clip_obs: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", np.sqrt(self.var + self.epsilon))  # once, not at every decision

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        normalized = (observation - self.mean) / self.scale
        return np.clip(normalized, -self.clip_obs, self.clip_obs).astype(np.float32)


def _read_normalization(obj: _JsonObject, input_shape: tuple[int, ...]) -> ObsNormalization | None:
    """The observation statistics (None when observations were not normalised); one per policy-input element."""
    if not obj.flag("norm_obs"):
        return None
    var = _read_numbers(obj, "var", input_shape, bound=False)
    if np.any(var < 0):
        raise obj.error("var", "variances >= 0")
    epsilon, clip_obs = obj.number("epsilon"), obj.number("clip_obs")
    if not (epsilon > 0 and clip_obs > 0):
        raise ValueError(f"{obj.path}: fields {obj.prefix}epsilon and {obj.prefix}clip_obs must be > 0, got {epsilon}, {clip_obs}")
    return ObsNormalization(_read_numbers(obj, "mean", input_shape, bound=False), var, epsilon, clip_obs)


def policy_input_shape(config: PPOConfig) -> tuple[int, ...]:
    """The shape of one observation the policy reads (before SB3 moves image channels first)."""
    return (len(STATE_FIELDS),) if config.obs == "state" else (PIXEL_SIZE, PIXEL_SIZE, config.frame_stack)


def _check_spaces(policy_json: Path, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, config: PPOConfig) -> None:
    """The saved spaces must fit what config.json says the agent feeds the policy and does with its actions."""
    expected = policy_input_shape(config)
    accepted = {expected, (expected[-1], *expected[:-1])}  # SB3 trains image policies channels-first
    if observation_space.shape not in accepted:
        raise ValueError(f"{policy_json}: observation_space shape {list(observation_space.shape)} does not match "
                         f"obs={config.obs!r}, frame_stack={config.frame_stack} in {CONFIG_FILE} (expected {list(expected)})")
    actions = 2 if config.pedal_action else 3
    if action_space.shape != (actions,):
        raise ValueError(f"{policy_json}: action_space shape {list(action_space.shape)} does not match "
                         f"pedal_action={config.pedal_action} in {CONFIG_FILE} (expected [{actions}])")


def _export_hint(folder: Path) -> str:
    return (f"if you made {folder} yourself, export it with `nsacdrive expert export {folder}` "
            f"(that loads {MODEL_FILE} and {VECNORMALIZE_FILE}, pickles that can execute code)")


def _read_json(path: Path) -> dict[str, Any]:
    _check_file(path, f"the exported policy written by `nsacdrive expert train`; {_export_hint(path.parent)}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not JSON ({exc}): expected the exported policy written by `nsacdrive expert train`") from None
    if not isinstance(data, dict) or data.get("format") != POLICY_FORMAT:
        raise ValueError(f"{path} is not an exported PPO policy: expected a JSON object with \"format\": \"{POLICY_FORMAT}\"")
    if data.get("version") != POLICY_FORMAT_VERSION:
        raise ValueError(f"{path}: format version {_short(data.get('version'))} is not supported "
                         f"(expected {POLICY_FORMAT_VERSION}); {_export_hint(path.parent)}")
    return data


def _read_weights(path: Path, sha256: str) -> dict[str, Any]:
    """The tensors of ``path``, after checking the file's sha256 against policy.json's."""
    import safetensors.torch
    import torch

    _check_file(path, f"the policy weights written by `nsacdrive expert train`; {_export_hint(path.parent)}")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ValueError(f"{path} is corrupt: its sha256 is {actual}, {POLICY_FILE} expects {sha256}")
    try:
        weights = safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own error type on malformed headers
        raise ValueError(f"{path} is not a safetensors file ({type(exc).__name__}: {exc})") from None
    if not all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()):
        raise ValueError(f"{path}: the weights contain NaN or infinity")
    return weights


def _load_weights(policy, weights: dict[str, Any], path: Path) -> None:
    """Load ``weights`` into ``policy`` (strict), after checking names, shapes and dtypes against its architecture."""
    state = policy.state_dict()
    canonical = _canonical_names(state)
    stored = {name for name, first in canonical.items() if name == first}
    missing, unexpected = sorted(stored - set(weights)), sorted(set(weights) - stored)
    if missing or unexpected:
        raise ValueError(f"{path}: tensors do not match the architecture in {POLICY_FILE} "
                         f"(missing {_short(missing)}, unexpected {_short(unexpected)})")
    for name in sorted(stored):
        want, got = state[name], weights[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(f"{path}: tensor {name!r} is {got.dtype} {list(got.shape)}, the architecture in "
                             f"{POLICY_FILE} needs {want.dtype} {list(want.shape)}")
    policy.load_state_dict({name: weights[first] for name, first in canonical.items()}, strict=True)


@dataclass(frozen=True)
class ExportedPolicy:
    """A policy rebuilt from ``policy.safetensors`` + ``policy.json``, with its observation statistics."""

    policy: Any  # stable_baselines3's ActorCriticPolicy, in eval mode
    normalization: ObsNormalization | None
    num_timesteps: int


def load_exported_policy(folder: str | Path, config: PPOConfig) -> ExportedPolicy:
    """Rebuild the policy of a PPO folder from its exported files alone (no pickle is read)."""
    folder = Path(folder)
    path = folder / POLICY_FILE
    root = _JsonObject(path, _read_json(path))
    sha256 = root.get("weights_sha256", str, "a sha256 hex digest")
    if len(sha256) != 64 or not set(sha256) <= set("0123456789abcdef"):
        raise root.error("weights_sha256", "a sha256 hex digest (64 lowercase hex digits)")
    num_timesteps = root.get("num_timesteps", int, "a whole number")
    spec = root.object("policy")
    policy_class = _policy_classes()[spec.choice("class", tuple(_policy_classes()))]
    kwargs = _read_policy_kwargs(spec)
    observation_space, action_space = _read_box(root.object("observation_space")), _read_box(root.object("action_space"))
    _check_spaces(path, observation_space, action_space, config)
    normalization = _read_normalization(root.object("obs_normalization"), policy_input_shape(config))
    weights = _read_weights(folder / POLICY_WEIGHTS_FILE, sha256)
    try:
        policy = policy_class(observation_space, action_space, lambda _: 0.0, **kwargs)
    except Exception as exc:  # SB3 asserts and raises many kinds on inconsistent arguments
        raise ValueError(f"{path}: cannot build the policy it describes ({type(exc).__name__}: {exc})") from None
    _load_weights(policy, weights, folder / POLICY_WEIGHTS_FILE)
    policy.set_training_mode(False)
    return ExportedPolicy(policy, normalization, num_timesteps)


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
            return state.as_vector()
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

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        repeat = self._last_action is not None and self._step % self.cfg.frame_skip != 0
        self._step += 1
        if repeat:
            return self._last_action.copy()
        action = self.decide(self._policy_input(observation, state))
        self._last_action = pedal_to_car_action(action) if self.cfg.pedal_action else action
        return self._last_action.copy()
