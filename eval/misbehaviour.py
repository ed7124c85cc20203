"""Misbehaviour events in a closed-loop episode's per-step log: when, and how, the car starts to fail.

A step *misbehaves* when any of these holds (CarRacing runs at 50 steps per second):

* ``off_road``: |lateral error| > the road's half width (6.67 world units: no wheel-centre on the
  road any more, the definition the episode records count ``off_road_events`` by);
* ``spin``: |heading error| > 90°, the car faces against the direction of travel;
* ``stall``: speed < :attr:`EventConfig.stall_speed` for at least ``stall_steps`` steps in a
  row (the whole stretch counts), not counting the first ``start_steps`` of the episode, when
  every car is slow;
* ``left_playfield``: the episode ended by leaving the playfield (its record's reason), on the last step.

An *event* (a failure, in the misbehaviour-prediction literature) starts at the first
misbehaving step after at least ``recovery_steps`` nominal ones (or after the start): symptoms
that overlap or follow each other within that time are one failure. Its ``kind`` names the
conditions true at the onset; ``end`` is the step after its last misbehaving one. Events are labelled off line from the whole log, so a stall is known
from its first slow step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsacdrive.envs.car_racing import FPS
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH

KINDS = ("off_road", "spin", "stall", "left_playfield")


@dataclass(frozen=True)
class EventConfig:
    """What counts as misbehaving, in world units and steps (50 per second)."""

    half_width: float = TRACK_HALF_WIDTH
    spin_angle: float = np.pi / 2
    stall_speed: float = 2.0  # world units/s; CarRacing cruises at 40–90
    stall_steps: int = 2 * FPS
    start_steps: int = 2 * FPS  # the start (from standstill) is never a stall
    recovery_steps: int = FPS  # nominal steps that separate two events


@dataclass(frozen=True)
class Event:
    """One failure: its onset step, the step after its last misbehaving one and what was wrong at the onset."""

    onset: int
    end: int
    kind: str  # "+"-joined KINDS true at the onset, e.g. "off_road+spin"


def misbehaviour(arrays: dict[str, np.ndarray], reason: str, config: EventConfig = EventConfig()) -> dict[str, np.ndarray]:
    """Per-step masks [N] of every condition of :data:`KINDS` for one episode's log."""
    lateral = np.abs(np.asarray(arrays["lateral_error"], dtype=np.float64))
    heading = np.abs(np.asarray(arrays["heading_error"], dtype=np.float64))
    speed = np.asarray(arrays["speed"], dtype=np.float64)
    n = len(lateral)
    slow = speed < config.stall_speed
    slow[: config.start_steps] = False
    stall = _runs_at_least(slow, config.stall_steps)
    playfield = np.zeros(n, dtype=bool)
    if reason == "left_playfield" and n:
        playfield[-1] = True
    return {"off_road": lateral > config.half_width, "spin": heading > config.spin_angle, "stall": stall,
            "left_playfield": playfield}


def misbehaviour_events(arrays: dict[str, np.ndarray], reason: str, config: EventConfig = EventConfig()) -> list[Event]:
    """The episode's failures in order (see the module docstring)."""
    masks = misbehaviour(arrays, reason, config)
    events: list[Event] = []
    for start, stop in true_runs(np.logical_or.reduce(list(masks.values()))):
        if events and start - events[-1].end < config.recovery_steps:  # too soon after the last one: the same failure
            events[-1] = Event(events[-1].onset, stop, events[-1].kind)
        else:
            events.append(Event(start, stop, "+".join(name for name in KINDS if masks[name][start])))
    return events


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of every run of True in ``mask``, stop exclusive."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _runs_at_least(mask: np.ndarray, length: int) -> np.ndarray:
    """``mask`` keeping only runs of True at least ``length`` long."""
    out = np.zeros_like(mask)
    for start, stop in true_runs(mask):
        if stop - start >= length:
            out[start:stop] = True
    return out
