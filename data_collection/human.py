"""Record human driving: play in a window and save every finished episode.

Keys: arrows drive (a gamepad's first axis steers too), R restarts the current episode
(discarding it), Q or Escape quits (finished episodes are already written). The window caption
shows the seed, step, speed factor and whether recording is on. ``slow_motion`` F runs the game
F× slower than CarRacing's 50 fps (F = 2 → half speed).

``carracing`` plays in CarRacing's own top-down window; ``udacity-style`` shows the front camera
(:class:`nsacdrive.envs.camera_window.CameraWindow`, with a speed/steer/pedal readout) and
records all three cameras. Episodes are written exactly as :mod:`nsacdrive.data_collection.recorder`
writes them, in either layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium
import pygame

from nsacdrive.agents.human import HumanAgent
from nsacdrive.agents.rollout import Step, drive
from nsacdrive.common.config_checks import AT_LEAST_ONE, NON_NEGATIVE, Range, check_fields
from nsacdrive.data_collection.recorder import (
    check_camera_fov,
    episode_from_steps,
    make_recording_env,
    prepare_folder,
    recording_renderer,
    write_index,
    write_layout_episode,
)
from nsacdrive.data_collection.udacity_layout import MPH_PER_UNIT_PER_SECOND
from nsacdrive.envs.camera_window import CameraWindow, Readout
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS
from nsacdrive.envs.colours import validate_preset
from nsacdrive.envs.front_camera import HORIZONTAL_FOV, CameraConfig
from nsacdrive.envs.observation_kinds import DEFAULT_CAMERA_FOV, RECORDING_ENVS
from nsacdrive.envs.udacity_style import FRAME_SHAPE, SideCameraLog

FPS = 50  # CarRacing's own frame rate (the human render ticks at it)
#: the numbers each field of :class:`HumanDriveConfig` may take (``max_episodes`` may also be None)
RANGES = {"seed": NON_NEGATIVE, "slow_motion": Range(1), "max_steps": AT_LEAST_ONE, "max_episodes": AT_LEAST_ONE,
          "window_scale": AT_LEAST_ONE, "camera_fov": HORIZONTAL_FOV}


@dataclass(frozen=True)
class HumanDriveConfig:
    """A human driving session.

    :param seed: track seed of the first episode (then ``seed + 1``, … after each finished one)
    :param colour_preset: one colour preset for every episode
    :param slow_motion: run the game this many times slower than real time (>= 1)
    :param max_steps: episode horizon
    :param max_episodes: stop after this many finished episodes (None: play until quit)
    :param env: ``carracing`` (top-down window) or ``udacity-style`` (front-camera window)
    :param layout: one of :data:`nsacdrive.data_collection.recorder.LAYOUTS` (``udacity`` needs ``udacity-style``)
    :param renderer: CarRacing frame renderer (None: ``fast``); ``udacity-style`` draws its own camera
    :param window_scale: magnification of the front-camera window (3: 960×480 for 320×160 frames)
    :param camera_fov: ``udacity-style``: the cameras' horizontal field of view (degrees)
    """

    seed: int = 0
    colour_preset: str = "default"
    slow_motion: float = 1.0
    max_steps: int = MAX_EPISODE_STEPS
    max_episodes: int | None = None
    env: str = "carracing"
    layout: str = "episodes"
    renderer: str | None = None
    window_scale: int = 3
    camera_fov: float = DEFAULT_CAMERA_FOV

    def __post_init__(self) -> None:
        check_fields(self, "drive config", RANGES)
        check_camera_fov(self.env, self.layout, self.camera_fov, "drive config")
        validate_preset(self.colour_preset)
        object.__setattr__(self, "renderer", recording_renderer(self.env, self.layout, self.renderer, "drive config"))

    @property
    def front_camera(self) -> bool:
        return self.env == "udacity-style"


@dataclass
class HumanSession:
    """What a session did: ids of the episodes written, restarts, whether the player quit."""

    written: list[str] = field(default_factory=list)
    restarts: int = 0
    quit: bool = False


def status_line(seed: int, step: int, slow_motion: float, recording: bool) -> str:
    speed = "real time" if slow_motion == 1 else f"1/{slow_motion:g} speed"
    return (f"nsacdrive drive | seed {seed} | step {step} | {speed} | "
            f"{'REC' if recording else 'not recording'} | R restart, Q quit")


def readout(step: Step, step_count: int, recording: bool) -> Readout:
    """The front-camera window's strip: speed (mph, as the Udacity log has it), step, REC and the executed action."""
    speed = abs(step.next_state.pose.forward_speed) * MPH_PER_UNIT_PER_SECOND
    steer, gas, brake = (float(v) for v in step.executed)
    return Readout(f"{speed:.0f} mph   step {step_count}   {'REC' if recording else 'not recording'}", steer, gas, brake)


class HumanView:
    """What the player sees: CarRacing's own window (top-down) or the front-camera window."""

    def __init__(self, config: HumanDriveConfig) -> None:
        self.window = CameraWindow(FRAME_SHAPE, config.window_scale, FPS) if config.front_camera else None

    def show(self, step: Step, step_count: int, caption: str, recording: bool) -> None:
        if self.window is None:  # CarRacing drew the frame and ticked the clock inside step()
            pygame.display.set_caption(caption)
        else:
            self.window.show(step.next_observation, readout(step, step_count, recording), caption)

    def close(self) -> None:
        if self.window is not None:
            self.window.close()


def _make_env(config: HumanDriveConfig) -> gymnasium.Env:
    render_mode = None if config.front_camera else "human"
    return make_recording_env(config.env, config.colour_preset, config.max_steps, config.renderer, render_mode,
                              CameraConfig(horizontal_fov=config.camera_fov))


def _episode_id(config: HumanDriveConfig, seed: int, stamp: str, index: int) -> str:
    env = "" if config.env == "carracing" else f"_{config.env}"
    return f"human_{config.colour_preset}_seed{seed:06d}_{stamp}_{index:03d}{env}"


def record_human(
    out_dir: str | Path | None,
    config: HumanDriveConfig = HumanDriveConfig(),
    events: Callable[[], Iterable[pygame.event.Event]] | None = None,
) -> HumanSession:
    """Play episodes on seeds ``config.seed``, ``+ 1``, … until quit (or ``config.max_episodes`` finished).

    ``out_dir`` None plays without recording; otherwise each finished episode is written in
    ``config.layout`` (ids carry a timestamp, so sessions never overwrite each other).
    ``events`` replaces ``pygame.event.get`` (tests).
    """
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        prepare_folder(out, config.layout)
    agent = HumanAgent(events=events)
    env = _make_env(config)
    view = HumanView(config)
    session = HumanSession()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    extra_delay = (config.slow_motion - 1.0) / FPS
    seed = config.seed
    try:
        while not session.quit and (config.max_episodes is None or len(session.written) < config.max_episodes):
            steps: list[Step] = []
            finished = False
            for step in drive(env, agent, seed):
                steps.append(step)
                recording = out is not None
                view.show(step, len(steps), status_line(seed, len(steps), config.slow_motion, recording), recording)
                if extra_delay > 0:
                    time.sleep(extra_delay)
                if agent.quit_requested or agent.restart_requested:
                    break
                finished = step.terminated or step.truncated
            if agent.quit_requested:
                session.quit = True
                break
            if not finished:  # restart: discard this attempt, same track again
                session.restarts += 1
                continue
            if out is not None:
                arrays, metadata = episode_from_steps(
                    steps, env, frame_kind=RECORDING_ENVS[config.env], source=agent.source, agent_config=agent.config(),
                    agent_spec="human", track_seed=seed, colour_preset=config.colour_preset, renderer=config.renderer,
                    max_steps=config.max_steps, side_frames=env.frames if isinstance(env, SideCameraLog) else None,
                )
                episode_id = _episode_id(config, seed, stamp, len(session.written))
                write_layout_episode(out, episode_id, arrays, metadata, config.layout)
                write_index(out, config.layout)
                session.written.append(episode_id)
            seed += 1
    finally:
        env.close()
        view.close()
    return session
