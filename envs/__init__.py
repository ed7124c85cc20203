"""Environments: CarRacing with colour schemes, track geometry, privileged state, the one
observation preprocessing function, and the Udacity-style front-camera variant."""

from nsacdrive.envs.car_racing import ENV_ID, MAX_EPISODE_STEPS, NsacCarRacing, make_car_racing
from nsacdrive.envs.colours import DEFAULT_SCHEME, ColourScheme, list_presets, resolve_colour_scheme
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH, TrackGeometry, TrackProjection, wrap_angle
from nsacdrive.envs.observation import PREPROCESSED_FRAME_SHAPE, RAW_FRAME_SHAPE, preprocess_observation
from nsacdrive.envs.state import STATE_FIELDS, CarPose, PrivilegedState, car_pose, privileged_state
from nsacdrive.envs.udacity_style import UdacityStyleCarRacing, make_udacity_style
from nsacdrive.envs.wrappers import PixelJitter, PixelJitterConfig

__all__ = [
    "ENV_ID", "MAX_EPISODE_STEPS", "NsacCarRacing", "make_car_racing",
    "DEFAULT_SCHEME", "ColourScheme", "list_presets", "resolve_colour_scheme",
    "TRACK_HALF_WIDTH", "TrackGeometry", "TrackProjection", "wrap_angle",
    "PREPROCESSED_FRAME_SHAPE", "RAW_FRAME_SHAPE", "preprocess_observation",
    "STATE_FIELDS", "CarPose", "PrivilegedState", "car_pose", "privileged_state",
    "PixelJitter", "PixelJitterConfig",
    "UdacityStyleCarRacing", "make_udacity_style",
]
