"""One line per closed-loop episode: did it lap, and when and how did it misbehave.

``nsacdrive eval`` prints aggregates; this is the per-episode view behind them. Each line gives
the episode, whether it lapped, its score and length, and its misbehaviour events
(:func:`nsacdrive.eval.misbehaviour.misbehaviour_events`: off the road, spinning, stalled, out of
the playfield) with the seconds they start and end, a safe stop and the share of steps under a
fallback where there were any, or the fault that ended it. Lines fit a
terminal's width; the records and logs in ``EVAL_DIR/episodes`` hold everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsacdrive.envs.car_racing import FPS
from nsacdrive.eval.closed_loop import SAFE_STOP
from nsacdrive.eval.misbehaviour import Event, misbehaviour_events
from nsacdrive.eval.results import load_episode, load_records

#: the widest line :func:`episode_lines` writes
LINE_WIDTH = 100
_HEAD = f"{'lap':>4}{'score':>8}{'secs':>6}  "


def describe_events(events: list[Event]) -> str:
    """``off_road 12.3–12.8 s; spin 30.1–31.0 s`` (or ``none``)."""
    return "; ".join(f"{e.kind} {e.onset / FPS:.1f}–{e.end / FPS:.1f} s" for e in events) or "none"


def _what_happened(eval_dir: Path, record: dict[str, Any]) -> tuple[str, bool]:
    """The episode's events (or its fault) as text, and whether it misbehaved or faulted."""
    if record["failed"]:
        return f"fault: {record['reason']}", True
    _, arrays = load_episode(eval_dir, record["episode_id"])
    events = misbehaviour_events(arrays, record["reason"])
    text = describe_events(events)
    fallback = float(record.get("fallback_fraction", 0.0))
    if record["reason"] == SAFE_STOP:
        text = f"safe stop at {record['steps'] / FPS:.1f} s; {text}"
    if fallback > 0:
        text = f"{100 * fallback:.0f} % under the fallback; {text}"
    return text, bool(events) or record["reason"] == SAFE_STOP


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def episode_lines(eval_dir: str | Path, misbehaving_only: bool = False) -> list[str]:
    """The header and one line per episode of the evaluation in ``eval_dir`` (only those that
    misbehaved or faulted with ``misbehaving_only``), each at most :data:`LINE_WIDTH` characters."""
    eval_dir = Path(eval_dir)
    rows = []
    for record in load_records(eval_dir):
        happened, misbehaved = _what_happened(eval_dir, record)
        if misbehaved or not misbehaving_only:
            rows.append((record, happened))
    id_width = min(max([len("episode"), *(len(r["episode_id"]) for r, _ in rows)]) + 1, 44)
    events_width = LINE_WIDTH - id_width - len(_HEAD)
    lines = [f"{'episode':<{id_width}}{_HEAD}events"]
    for record, happened in rows:
        lap = "yes" if record.get("lap_finished") else "no"
        lines.append(f"{_clip(record['episode_id'], id_width - 1):<{id_width}}{lap:>4}{record['score']:>8.1f}"
                     f"{record['steps'] / FPS:>6.1f}  {_clip(happened, events_width)}")
    return lines
