"""Record human driving: play CarRacing in a window and save every finished episode.

Keys: arrows drive (a gamepad's first axis steers too), R restarts the current episode
(discarding it), Q or Escape quits (finished episodes are already written). The window caption
shows the seed, step, speed factor and whether recording is on. ``slow_motion`` F runs the game
F× slower than CarRacing's 50 fps (F = 2 → half speed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pygame
from nsacdrive.agents.human import HumanAgent
from nsacdrive.agents.rollout import Step, drive
from nsacdrive.common.atomic import remove_partial_files
from nsacdrive.data_collection.episode import write_episode
from nsacdrive.data_collection.manifest import write_manifest
from nsacdrive.data_collection.recorder import DEFAULT_RENDERER, episode_from_steps
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS, make_car_racing
from nsacdrive.envs.colours import validate_preset

FPS = 50  # CarRacing's own frame rate (the human render ticks at it)


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


def record_human(
    out_dir: str | Path | None,
    seed: int = 0,
    colour_preset: str = "default",
    slow_motion: float = 1.0,
    max_steps: int = MAX_EPISODE_STEPS,
    max_episodes: int | None = None,
    renderer: str = DEFAULT_RENDERER,
    events: Callable[[], Iterable[pygame.event.Event]] | None = None,
) -> HumanSession:
    """Play episodes on seeds ``seed``, ``seed + 1``, … until quit (or ``max_episodes`` finished).

    ``out_dir`` None plays without recording. ``events`` replaces ``pygame.event.get`` (tests).
    """
    if slow_motion < 1:
        raise ValueError(f"--slow-motion must be >= 1, got {slow_motion}")
    validate_preset(colour_preset)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        remove_partial_files(out)
    agent = HumanAgent(events=events)
    env = make_car_racing(colour_preset=colour_preset, render_mode="human", max_episode_steps=max_steps,
                          renderer=renderer)
    session = HumanSession()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    extra_delay = (slow_motion - 1.0) / FPS
    try:
        while not session.quit and (max_episodes is None or len(session.written) < max_episodes):
            steps: list[Step] = []
            finished = False
            for step in drive(env, agent, seed):
                steps.append(step)
                pygame.display.set_caption(status_line(seed, len(steps), slow_motion, out is not None))
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
                    steps, env, source=agent.source, agent_config=agent.config(), agent_spec="human",
                    track_seed=seed, colour_preset=colour_preset, renderer=renderer, max_steps=max_steps,
                )
                episode_id = f"human_{colour_preset}_seed{seed:06d}_{stamp}_{len(session.written):03d}"
                write_episode(out, episode_id, arrays, metadata)
                write_manifest(out)
                session.written.append(episode_id)
            seed += 1
    finally:
        env.close()
    return session
