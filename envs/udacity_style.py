"""``nsacdrive/UdacityStyle-v0``: CarRacing's tracks and physics seen through a front camera.

The Udacity simulator's data are 320×160 RGB frames from a camera behind the windscreen (plus
two cameras offset sideways), not CarRacing's top-down 96×96 view. This env keeps everything of
:class:`nsacdrive.envs.car_racing.NsacCarRacing` — tracks of a seed, colour presets, Box2D physics, action
space, reward, termination, ``track_seed``/``geometry``/``car`` attributes, so
:func:`nsacdrive.envs.state.privileged_state`, the pure-pursuit expert and :func:`nsacdrive.agents.rollout.drive` work
unchanged — and replaces the observation by the front camera of :mod:`nsacdrive.envs.front_camera`.

Side cameras cost two more renders, so they are drawn only when asked: with
``side_cameras=True`` every ``reset`` and ``step`` info carries ``left_observation`` and
``right_observation`` (same shape as the observation); :meth:`UdacityStyleCarRacing.render_camera`
draws any camera on demand. ``render()`` keeps CarRacing's top-down ``human``/``rgb_array`` views.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS, NsacCarRacing, make_registered
from nsacdrive.envs.front_camera import CameraConfig, FrontCamera

ENV_ID = "nsacdrive/UdacityStyle-v0"
RENDERER = "front-camera"
FRAME_SHAPE = CameraConfig().shape  # (160, 320, 3), the Udacity simulator's frame
#: camera name → lateral offset in units of ``CameraConfig.side_offset`` (+ = right)
CAMERAS = {"center": 0.0, "left": -1.0, "right": 1.0}
SIDE_CAMERAS = ("left", "right")


class UdacityStyleCarRacing(NsacCarRacing):
    """NsacCarRacing whose observation is the front camera (uint8, ``camera.shape``)."""

    def __init__(
        self,
        render_mode: str | None = None,
        colour_preset: str = "default",
        render_observations: bool = True,
        side_cameras: bool = False,
        camera: CameraConfig = CameraConfig(),
        lap_complete_percent: float = 0.95,
    ) -> None:
        if side_cameras and not render_observations:
            raise ValueError("side_cameras=True needs render_observations=True (side frames are observations too)")
        super().__init__(render_mode=render_mode, colour_preset=colour_preset, render_observations=render_observations,
                         lap_complete_percent=lap_complete_percent)
        self.renderer = RENDERER
        self.side_cameras = bool(side_cameras)
        self.camera = FrontCamera(camera)
        self.observation_space = spaces.Box(0, 255, camera.shape, dtype=np.uint8)

    def render_camera(self, name: str = "center") -> np.ndarray:
        """The frame of camera ``name`` (``center``, ``left`` or ``right``) in the current state."""
        if name not in CAMERAS:
            raise ValueError(f"camera must be one of {', '.join(CAMERAS)}, got {name!r}")
        if self.car is None:
            return self.blank_frame()  # like stock: nothing to draw before the first reset
        return self.camera.render(self, CAMERAS[name] * self.camera.config.side_offset)

    def render_observation(self) -> np.ndarray:
        """The centre camera's frame, even in render-free mode."""
        return self.render_camera("center")

    def _side_frames(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.side_cameras:
            info.update({f"{name}_observation": self.render_camera(name) for name in SIDE_CAMERAS})
        return info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, self._side_frames(info)

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if action is not None:  # reset() steps once without an action; it adds the side frames itself
            info = self._side_frames(info)
        return observation, reward, terminated, truncated, info


class SideCameraLog(gym.Wrapper):
    """Keeps the current episode's side-camera frames from ``reset`` and every ``step``.

    For recorders: :func:`nsacdrive.agents.rollout.drive` drops the reset info, and with it the first
    side frames. ``frames[name]`` lines up with the observations (T+1 frames after T steps).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not getattr(env.unwrapped, "side_cameras", False):
            raise ValueError("SideCameraLog needs a UdacityStyle env made with side_cameras=True")
        self.frames: dict[str, list[np.ndarray]] = {name: [] for name in SIDE_CAMERAS}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = self.env.reset(seed=seed, options=options)
        self.frames = {name: [info[f"{name}_observation"]] for name in SIDE_CAMERAS}
        return observation, info

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        for name in SIDE_CAMERAS:
            self.frames[name].append(info[f"{name}_observation"])
        return observation, reward, terminated, truncated, info


gym.register(id=ENV_ID, entry_point=UdacityStyleCarRacing, max_episode_steps=MAX_EPISODE_STEPS)


def make_udacity_style(
    colour_preset: str = "default",
    render_observations: bool = True,
    render_mode: str | None = None,
    max_episode_steps: int = MAX_EPISODE_STEPS,
    side_cameras: bool = False,
    camera: CameraConfig = CameraConfig(),
) -> gym.Env:
    """The one factory for front-camera envs (mirrors :func:`nsacdrive.envs.car_racing.make_car_racing`).

    Args:
        colour_preset: a name from :func:`nsacdrive.envs.colours.list_presets` (recolours road, grass,
            kerbs and sky; see :class:`nsacdrive.envs.front_camera.FrontCameraPalette`).
        render_observations: False skips drawing on ``step`` (observations are zeros).
        render_mode: gymnasium render mode for ``env.render()`` (CarRacing's top-down views).
        max_episode_steps: truncation horizon (1000 = the standard CarRacing protocol).
        side_cameras: also draw the left/right cameras into every info dict.
        camera: the camera geometry (the default is the Udacity-like 320×160 view).
    """
    return make_registered(ENV_ID, max_episode_steps, colour_preset=colour_preset,
                           render_observations=render_observations, render_mode=render_mode,
                           side_cameras=side_cameras, camera=camera)
