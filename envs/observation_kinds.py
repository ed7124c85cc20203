"""The ONE dispatch from an observation kind to its raw frames and their preprocessing.

A controller's ``ModelConfig.observation`` names its kind; training (the dataset), offline
evaluation and the closed-loop agents all take the transform from :func:`preprocess_for`, so a
model never sees frames prepared another way than it was trained on. An episode's sidecar field
``frame_kind`` says which raw frames it stores (absent: ``carracing``).

| kind       | raw frame (H, W, C) | network frame (C, H, W) | transform                               |
|------------|---------------------|-------------------------|-----------------------------------------|
| carracing  | 96×96×3             | 3×84×96, [0, 1] RGB     | :func:`nsacdrive.envs.observation.preprocess_observation` |
| udacity    | 160×320×3           | 3×66×200, [−1, 1] YUV   | :func:`nsacdrive.envs.udacity_observation.preprocess_udacity` |

Each transform is two steps: ``encode`` (raw → uint8 in the network's layout: what datasets
store and batches carry) and a scaling ``x / divisor + offset`` (float32, done on the model's
device by :func:`nsacdrive.data_collection.dataset.network_frames`); ``preprocess`` is both.

Kind ``udacity`` is drawn by a front camera whose horizontal field of view (``camera_fov``,
degrees) is a setting of the recording (sidecar field ``camera_fov``, absent: the simulator's
65°) and of the controller trained on it (``ModelConfig.camera_fov``): a controller drives with
the camera its frames came from (:func:`make_env_for`); ``carracing`` has no such setting.

``intro_steps`` are skipped at the start of every episode (CarRacing's zoom-in animation; a
recording has none). Timestamps are one convention for every kind — frames counted at
CarRacing's 50 Hz (:func:`nsacdrive.data_collection.dataset.sequence_timestamps`) — so the closed-loop
agents need no per-kind timing; for Udacity recordings (~10 Hz) they are a nominal time scale
the heads learn, not wall-clock seconds.

An environment joins with :func:`register_observation_kind`: its frame kind and a maker of its
env (CarRacing underneath), after which the recorder records it (``CollectConfig.env``, one of
:data:`RECORDING_ENVS`), training reads its frames (``ModelConfig.observation``) and
:func:`make_env_for` builds it for the closed loop, in the registering process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from nsacdrive.envs.car_racing import INTRO_STEPS, NsacCarRacing, make_car_racing
from nsacdrive.envs.front_camera import HORIZONTAL_FOV, CameraConfig
from nsacdrive.envs.observation import (
    PREPROCESS_VERSION,
    PREPROCESSED_FRAME_SHAPE,
    RAW_FRAME_SHAPE,
    encode_observation,
    preprocess_observation,
)
from nsacdrive.envs.udacity_observation import (
    UDACITY_FRAME_SHAPE,
    UDACITY_PREPROCESS_VERSION,
    UDACITY_RAW_FRAME_SHAPE,
    encode_udacity,
    preprocess_udacity,
)

DEFAULT_FRAME_KIND = "carracing"
#: the front camera's horizontal field of view when a recording or a model config names none
DEFAULT_CAMERA_FOV = CameraConfig().horizontal_fov


@dataclass(frozen=True)
class ObservationKind:
    """What one kind of camera frame looks like, raw and preprocessed, and what reads it by default."""

    name: str
    raw_shape: tuple[int, int, int]
    frame_shape: tuple[int, int, int]
    preprocess: Callable[[np.ndarray], np.ndarray]
    encode: Callable[[np.ndarray], np.ndarray]  # raw → uint8 network layout; preprocess = scaled encode
    divisor: float  # network = encoded / divisor + offset (float32)
    offset: float
    version: str  # of ``preprocess``: recorded in sidecars, names cached encodings
    intro_steps: int
    default_encoder: str
    env: str  # the recorder's env (``nsacdrive collect --env``) whose camera draws these frames


OBSERVATION_KINDS: dict[str, ObservationKind] = {
    "carracing": ObservationKind("carracing", RAW_FRAME_SHAPE, PREPROCESSED_FRAME_SHAPE, preprocess_observation,
                                 encode_observation, divisor=255.0, offset=0.0, version=PREPROCESS_VERSION,
                                 intro_steps=INTRO_STEPS, default_encoder="cnn", env="carracing"),
    "udacity": ObservationKind("udacity", UDACITY_RAW_FRAME_SHAPE, UDACITY_FRAME_SHAPE, preprocess_udacity,
                               encode_udacity, divisor=127.5, offset=-1.0, version=UDACITY_PREPROCESS_VERSION,
                               intro_steps=0, default_encoder="nvidia", env="udacity-style"),
}
#: the recorder's envs (``CollectConfig.env``) → the observation kind whose frames each draws
RECORDING_ENVS: dict[str, str] = {kind.env: kind.name for kind in OBSERVATION_KINDS.values()}

#: ``make_env(colour_preset=, max_episode_steps=, renderer=, render_mode=)`` → an env whose
#: ``unwrapped`` is CarRacing (:class:`nsacdrive.envs.car_racing.NsacCarRacing`)
EnvMaker = Callable[..., gym.Env]
#: how each kind's env is built, by kind name; ``udacity``'s front-camera simulator is absent: it
#: needs a camera, which :func:`make_env_for` and the recorder give it
ENV_MAKERS: dict[str, EnvMaker] = {"carracing": make_car_racing}


def register_observation_kind(kind: ObservationKind, make_env: EnvMaker) -> None:
    """Add ``kind`` and the env that draws its frames, ``make_env`` (see :data:`EnvMaker`), under
    the env name ``kind.env``: the recorder, training and :func:`make_env_for` then take them like
    the built-in ones, in this process only. The env must keep CarRacing underneath, since the
    expert, the recorder and the closed loop read its track and car state."""
    if not kind.name or not kind.env or any(c in kind.env for c in "/\\: "):
        raise ValueError(f"observation kind {kind.name!r}, env {kind.env!r}: give non-empty names, the env's free of "
                         "'/', '\\', ':' and spaces (episode ids end in it)")
    if kind.name in OBSERVATION_KINDS:
        raise ValueError(f"observation kind {kind.name!r} is already registered")
    if kind.env in RECORDING_ENVS:
        raise ValueError(f"env {kind.env!r} is already registered")
    OBSERVATION_KINDS[kind.name] = kind
    RECORDING_ENVS[kind.env] = kind.name
    ENV_MAKERS[kind.name] = make_env


def make_kind_env(name: str, colour_preset: str, max_episode_steps: int, renderer: str,
                  render_mode: str | None = None) -> gym.Env:
    """Kind ``name``'s env from :data:`ENV_MAKERS`, checked to be CarRacing underneath (a wrapper
    may change the frames, not the car or the track the agents read)."""
    env = ENV_MAKERS[name](colour_preset=colour_preset, max_episode_steps=max_episode_steps, renderer=renderer,
                           render_mode=render_mode)
    if not isinstance(env.unwrapped, NsacCarRacing):
        env.close()
        raise TypeError(f"env {OBSERVATION_KINDS[name].env!r}: env.unwrapped must be nsacdrive's CarRacing "
                        f"(make_car_racing), got {type(env.unwrapped).__name__}")
    return env


def observation_kind(name: str, what: str = "observation") -> ObservationKind:
    """The kind called ``name``; ``what`` names the field or argument in the error."""
    if name not in OBSERVATION_KINDS:
        raise ValueError(f"{what}: unknown observation kind {name!r}; expected one of {', '.join(OBSERVATION_KINDS)}")
    return OBSERVATION_KINDS[name]


def preprocess_for(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The preprocessing function of observation kind ``name`` (raw uint8 frames → network frames)."""
    return observation_kind(name).preprocess


def camera_fov_for(name: str, camera_fov: float | None, what: str) -> float | None:
    """Kind ``name``'s camera field of view: ``camera_fov`` checked, or the default when None
    (``udacity``); None for kinds without a front camera, which must not name one. ``what`` names
    the field or argument in the error."""
    if observation_kind(name).name != "udacity":
        if camera_fov is not None:
            raise ValueError(f"{what}: only observation 'udacity' has a front camera; leave it out for {name!r}")
        return None
    if camera_fov is None:
        return DEFAULT_CAMERA_FOV
    if not HORIZONTAL_FOV.contains(camera_fov):
        raise ValueError(f"{what}: the horizontal field of view must be {HORIZONTAL_FOV} degrees, got {camera_fov}")
    return float(camera_fov)


def make_env_for(name: str, colour_preset: str, max_episode_steps: int, renderer: str = "fast", camera_fov: float | None = None):
    """The env whose camera makes kind ``name``'s raw frames (closed-loop driving of a controller).

    ``carracing``: CarRacing with ``renderer`` (fast or stock); ``udacity``: the front-camera
    simulator (:func:`nsacdrive.envs.udacity_style.make_udacity_style`, which has one renderer of its
    own) with a ``camera_fov``-degree camera (None: the default); a registered kind: its
    :data:`ENV_MAKERS` entry with ``renderer``."""
    from nsacdrive.envs.udacity_style import make_udacity_style

    camera_fov = camera_fov_for(name, camera_fov, "camera_fov")
    if camera_fov is not None:
        if renderer != "fast":
            raise ValueError(f"--renderer {renderer!r}: the front-camera simulator has its own renderer; use the default")
        return make_udacity_style(colour_preset=colour_preset, max_episode_steps=max_episode_steps,
                                  camera=CameraConfig(horizontal_fov=camera_fov))
    return make_kind_env(name, colour_preset, max_episode_steps, renderer)
