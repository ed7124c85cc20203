"""A PPO folder's exported policy: ``policy.safetensors`` + ``policy.json``, written from a trained
Stable-Baselines3 policy and read back without unpickling anything.

``policy.json`` names the policy class, its constructor arguments, the observation and action
spaces, VecNormalize's frozen observation statistics and the weights' sha256. Reading it looks
classes up by name in closed tables, bounds every size before anything is allocated, and checks
every field; each error names the file, the field and what was expected. This is all that
``ppo:DIR`` reads: ``model.zip`` and ``vecnormalize.pkl`` are pickles and could execute code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from nsacdrive.agents.ppo_config import ACTIVATIONS, PPOConfig
from nsacdrive.agents.ppo_envs import PIXEL_SIZE
from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.envs.state import STATE_FIELD_SETS

#: the files of a PPO folder
MODEL_FILE = "model.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
CONFIG_FILE = "config.json"
POLICY_WEIGHTS_FILE = "policy.safetensors"
POLICY_FILE = "policy.json"
POLICY_FORMAT = "nsacdrive-ppo-policy"
POLICY_FORMAT_VERSION = 1

def activation_classes() -> dict[str, Any]:
    """Activation name → torch module class (torch is imported only when a policy is built)."""
    import torch.nn as nn

    return {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def check_file(path: Path, expected: str) -> None:
    """Raise a clear error naming ``path`` and what it should hold when it is missing."""
    if not path.is_file():
        raise ValueError(f"{path} is missing: expected {expected}")


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
        "activation_fn": _name_of(policy.activation_fn, activation_classes(), "activation"),
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


def write_policy(policy, vecnorm, num_timesteps: int, folder: Path) -> None:
    """Write what ``ppo:DIR`` drives with: the weights (safetensors), then ``policy.json`` naming their sha256."""
    import safetensors.torch

    state = policy.state_dict()
    canonical = _canonical_names(state)
    weights = safetensors.torch.save({name: t.detach().cpu().contiguous() for name, t in state.items() if canonical[name] == name})
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
        "activation_fn": activation_classes()[obj.choice("activation_fn", ACTIVATIONS)],
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
    return (len(STATE_FIELD_SETS[config.state_fields]),) if config.obs == "state" else (PIXEL_SIZE, PIXEL_SIZE, config.frame_stack)


def _check_spaces(policy_json: Path, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, config: PPOConfig) -> None:
    """The saved spaces must fit what config.json says the agent feeds the policy and does with its actions."""
    expected = policy_input_shape(config)
    accepted = {expected, (expected[-1], *expected[:-1])}  # SB3 trains image policies channels-first
    if observation_space.shape not in accepted:
        raise ValueError(f"{policy_json}: observation_space shape {list(observation_space.shape)} does not match "
                         f"obs={config.obs!r}, frame_stack={config.frame_stack}, state_fields={config.state_fields!r} "
                         f"in {CONFIG_FILE} (expected {list(expected)})")
    actions = 2 if config.pedal_action else 3
    if action_space.shape != (actions,):
        raise ValueError(f"{policy_json}: action_space shape {list(action_space.shape)} does not match "
                         f"pedal_action={config.pedal_action} in {CONFIG_FILE} (expected [{actions}])")


def _export_hint(folder: Path) -> str:
    return (f"if you made {folder} yourself, export it with `nsacdrive expert export {folder}` "
            f"(that loads {MODEL_FILE} and {VECNORMALIZE_FILE}, pickles that can execute code)")


def _read_json(path: Path) -> dict[str, Any]:
    check_file(path, f"the exported policy written by `nsacdrive expert train`; {_export_hint(path.parent)}")
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

    check_file(path, f"the policy weights written by `nsacdrive expert train`; {_export_hint(path.parent)}")
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
