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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nsacdrive.envs.car_racing import INTRO_STEPS
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
    own) with a ``camera_fov``-degree camera (None: the default)."""
    from nsacdrive.envs.car_racing import make_car_racing
    from nsacdrive.envs.udacity_style import make_udacity_style

    camera_fov = camera_fov_for(name, camera_fov, "camera_fov")
    if camera_fov is not None:
        if renderer != "fast":
            raise ValueError(f"--renderer {renderer!r}: the front-camera simulator has its own renderer; use the default")
        return make_udacity_style(colour_preset=colour_preset, max_episode_steps=max_episode_steps,
                                  camera=CameraConfig(horizontal_fov=camera_fov))
    return make_car_racing(colour_preset=colour_preset, max_episode_steps=max_episode_steps, renderer=renderer)
