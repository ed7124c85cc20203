"""A closed-loop evaluation's terminal tables: one line per controller and condition
(:func:`summary_lines`, what ``nsacdrive eval`` prints), and one line per episode — did it lap, and
when and how did it misbehave (:func:`episode_lines`, ``nsacdrive episodes``).

The per-episode view is the one behind the aggregates. Each line gives
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
from nsacdrive.eval.results import condition_label, load_log, load_records

#: the widest line these tables write
LINE_WIDTH = 100
_HEAD = f"{'lap':>4}{'score':>8}{'secs':>6}  "


def describe_events(events: list[Event]) -> str:
    """``off_road 12.3–12.8 s; spin 30.1–31.0 s`` (or ``none``)."""
    return "; ".join(f"{e.kind} {e.onset / FPS:.1f}–{e.end / FPS:.1f} s" for e in events) or "none"


def _what_happened(eval_dir: Path, record: dict[str, Any]) -> tuple[str, bool]:
    """The episode's events (or its fault) as text, and whether it misbehaved or faulted."""
    if record["failed"]:
        return f"fault: {record['reason']}", True
    arrays = load_log(eval_dir, record)
    events = misbehaviour_events(arrays, record["reason"])
    text = describe_events(events)
    fallback = float(record.get("fallback_fraction", 0.0))
    if record["reason"] == SAFE_STOP:
        text = f"safe stop at {record['steps'] / FPS:.1f} s; {text}"
    if fallback > 0:
        text = f"{100 * fallback:.0f} % under the fallback; {text}"
    return text, bool(events) or record["reason"] == SAFE_STOP


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``eval``'s table in at most :data:`LINE_WIDTH` columns: per run and condition the episodes,
    the faults (episodes an exception ended), the laps finished beside the off-road events, success
    mean ± std over the repeats, mean score, mean |lateral error| and driving score. Long run and
    condition names are cut with an ellipsis."""
    head = f"{'episodes':>9}{'faults':>7}{'laps':>6}{'off-road':>9}{'success':>13}{'score':>8}{'|lat|':>7}{'DS':>6}"
    condition_need = max(len("condition"), *(len(condition_label(r)) for r in rows)) + 1
    run_need = max(len("run (model)"), *(len(f"{r['run']} ({r['model']})") for r in rows)) + 1
    room = LINE_WIDTH - len(head)
    condition_width = condition_need if run_need + condition_need <= room else min(condition_need, max(18, room - run_need))
    run_width = min(run_need, room - condition_width)
    lines = [f"{'run (model)':<{run_width}}{'condition':<{condition_width}}{head}"]
    for r in rows:
        lines.append(f"{_clip(r['run'] + ' (' + r['model'] + ')', run_width - 1):<{run_width}}"
                     f"{_clip(condition_label(r), condition_width - 1):<{condition_width}}{r['episodes']:>9}{r['faults']:>7}"
                     f"{r['laps']:>6}{r['off_road_events']:>9}{100 * r['success_mean']:>6.0f}% ± {100 * r['success_std']:<3.0f}"
                     f"{r['score_mean']:>8.1f}{r['mean_abs_lateral_error']:>7.2f}{r['driving_score']:>6.2f}")
    return lines


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
