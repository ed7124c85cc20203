"""What ``--fallback cascade:RUN`` cost, from the episode records: its network work as a share of
running the second controller every step (it runs only while the fallback acts, after a replay of the
frames it missed; :mod:`nsacdrive.eval.cascade`). Torch-free, so judging needs no model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cascade_history(run: str | Path) -> int:
    """Frames a run's controller keeps per episode: (sequence length − 1) · stride + 1."""
    from nsacdrive.controllers.run import read_run_config
    from nsacdrive.data_collection.dataset import sequence_offsets

    config = read_run_config(run)
    return 1 - int(sequence_offsets(config.sequence_length, config.frame_stride)[0])  # as ControllerPolicy keeps them


def cascade_share(records: Sequence[dict[str, Any]], history: int) -> float | None:
    """At most how much of running the cascade every step it did run: per episode the steps under the
    fallback plus a replay of ``history − 1`` frames per alarm onset (an onset that did not engage it
    replays nothing, hence "at most"), over the episodes' steps; None without episodes."""
    steps = sum(r["steps"] for r in records)
    if not steps:
        return None
    work = sum(min(r["fallback_fraction"] * r["steps"] + r["alarms"] * (history - 1), r["steps"]) for r in records)
    return float(work / steps)
