"""When a fallback hands the car back, and how long it should wait before doing so.

:class:`HandBack` is the switch the car runs step by step. :func:`active_steps` gives the same
answer for a whole logged score trace at once, so the protocol can ask what a hold time would have
done on many logged episodes. :func:`choose_hold` picks the hold on development logs alone.
The hold is the longest one whose share of nominal steps under the fallback stays within budget.
A longer hold keeps the fallback in charge through gaps in the alarms before a failure. It also
costs more nominal driving for every false alarm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nsacdrive.envs.car_racing import FPS


class ScoredEpisode(Protocol):
    """What the replay reads of a logged episode (:class:`nsacdrive.eval.monitor.EpisodeScores`, whose
    module reads evaluations, which import this one)."""

    scores: dict[str, np.ndarray]
    events: list[Any]  # each with an ``onset`` step
    nominal: np.ndarray
    warmup: int

    @property
    def steps(self) -> int: ...


@dataclass
class HandBack:
    """When the fallback acts: from an alarm until the smoothed score has stayed at or below
    ``release`` for ``clear_steps`` steps in a row (hysteresis: ``release`` at or below the alarm
    threshold), or for good with ``latch`` (``--fallback stop``)."""

    clear_steps: int
    release: float
    latch: bool = False
    active: bool = False
    clear: int = 0

    def update(self, score: float, alarm: bool) -> bool:
        """Whether the fallback acts at this step, given its score and whether it alarms."""
        if alarm:
            self.active, self.clear = True, 0
        elif self.active and not self.latch:
            self.clear = self.clear + 1 if score <= self.release else 0
            self.active = self.clear < self.clear_steps
        return self.active


def release_level(threshold: float, release: float) -> float:
    """The score level the fallback waits under before handing back: ``release`` of the way to the threshold."""
    return threshold - (1.0 - release) * abs(threshold)


def active_steps(score: np.ndarray, alarm: np.ndarray, clear_steps: int, release: float) -> np.ndarray:
    """For every step of one trace, whether :class:`HandBack` (not latched) acts, computed without a
    loop: a step is under the fallback if an alarm came before it and the score has not yet stayed
    at or below ``release`` for ``clear_steps`` steps in a row since that alarm."""
    score, alarm = np.asarray(score, dtype=np.float64), np.asarray(alarm, dtype=bool)
    steps = np.arange(len(score))
    clear = (score <= release) & ~alarm
    last_unclear = np.maximum.accumulate(np.where(clear, -1, steps))
    released = (steps - last_unclear) >= clear_steps  # the clear run ending here is long enough
    released_so_far = np.cumsum(released)
    alarms_so_far = np.cumsum(alarm)
    last_alarm = np.maximum.accumulate(np.where(alarm, steps, -1))
    released_at_alarm = released_so_far[np.maximum(last_alarm, 0)]
    return (alarms_so_far > 0) & (released_so_far == released_at_alarm)


def _alarms(episode: ScoredEpisode, name: str, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """A logged episode's score ``name`` and where it alarms (above ``threshold``, after the warm-up)."""
    score = episode.scores[name]
    return score, (score > threshold) & (np.arange(len(score)) >= episode.warmup)


@dataclass(frozen=True)
class HoldChoice:
    """The hold chosen on development logs, and what every candidate would have done there."""

    clear_steps: int
    candidates: list[dict[str, Any]]  # hold_s, steps, covered (share of the run-ups to failures under the fallback), nominal_share

    def to_dict(self) -> dict[str, Any]:
        return {"clear_steps": self.clear_steps, "hold_s": self.clear_steps / FPS, "candidates": self.candidates}


def choose_hold(failing: Sequence[ScoredEpisode], nominal: Sequence[ScoredEpisode], name: str, threshold: float,
                holds_s: Sequence[float], budget: float, release: float = 1.0, run_up_s: float = 1.0) -> HoldChoice:
    """The longest of ``holds_s`` whose fallback would have covered at most ``budget`` of the nominal
    steps of the ``nominal`` laps; the shortest when none is within budget. ``failing``: the logs whose
    failures are reported beside every candidate as ``covered``, the share of the ``run_up_s`` before
    each onset that the fallback would have been in charge of (so the choice can be read; it does not
    use them)."""
    run_up, level = max(1, round(run_up_s * FPS)), release_level(threshold, release)
    onsets = [(_alarms(e, name, threshold), [v.onset for v in e.events if 0 < v.onset < e.steps]) for e in failing if e.events]
    laps = [(_alarms(e, name, threshold), e.nominal) for e in nominal]
    total = sum(int(mask.sum()) for _, mask in laps)
    candidates = []
    for hold_s in sorted(holds_s):
        steps = max(1, round(hold_s * FPS))
        covered = []
        for alarms, starts in onsets:
            active = active_steps(*alarms, steps, level)
            covered += [float(active[max(onset - run_up, 0): onset].mean()) for onset in starts]
        under = sum(int((active_steps(*alarms, steps, level) & mask).sum()) for alarms, mask in laps)
        candidates.append({"hold_s": steps / FPS, "steps": steps, "covered": float(np.mean(covered)) if covered else None,
                           "failures": len(covered), "nominal_share": under / total if total else None})
    within = [c for c in candidates if c["nominal_share"] is not None and c["nominal_share"] <= budget]
    chosen = within[-1] if within else candidates[0]
    return HoldChoice(chosen["steps"], candidates)
