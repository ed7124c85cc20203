"""A PPO expert's learning curve: every periodic evaluation with the wall-clock time it came at.

``nsacdrive expert train`` evaluates the deterministic policy every ``eval_freq`` env steps on
evaluation tracks of its own (seeds offset from the training seed, never the held-out tracks).
After each evaluation :class:`CurveRecorder` appends one :class:`CurvePoint` to
``eval/curve.json``, redraws ``eval/curve.png`` (score and laps against decisions and against
minutes of training), both written atomically, and saves ``best/`` when the point is the best so
far: most laps finished, then the highest mean score (a teacher must finish its laps; the score
alone barely tells a lap from a near miss). A resumed run continues the same curve: its clock
starts where the last point left off, and its best must beat every earlier point.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.common.figures import new_figure, save_figure

CURVE_FILE = "curve.json"
CURVE_FIGURE = "curve.png"


@dataclass(frozen=True)
class CurvePoint:
    """One periodic evaluation: mean and std of the score, share of laps finished, when it came."""

    timesteps: int  # decisions (env steps of the training envs) so far
    seconds: float  # wall-clock seconds of training so far, summed over resumed sessions
    score_mean: float
    score_std: float
    lap_rate: float  # share of the evaluation episodes that finished the lap


def best_point(points: list[CurvePoint]) -> CurvePoint:
    """The point ``best/`` was saved at: most laps finished, then the highest mean score (the first of ties)."""
    return max(points, key=lambda p: (p.lap_rate, p.score_mean))


def read_curve(folder: str | Path) -> list[CurvePoint]:
    """The points in ``folder/curve.json`` (an empty list when there is none yet)."""
    path = Path(folder) / CURVE_FILE
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())["points"]
        return [CurvePoint(**row) for row in rows]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a learning curve written by `nsacdrive expert train` ({exc})") from None


def write_curve(folder: str | Path, points: list[CurvePoint]) -> None:
    """``curve.json`` and ``curve.png`` in ``folder``, each atomically."""
    folder = Path(folder)
    atomic_write_json(folder / CURVE_FILE, {"points": [asdict(p) for p in points]})
    save_figure(curve_figure(points), folder / CURVE_FIGURE)


def curve_figure(points: list[CurvePoint], title: str = "PPO expert: periodic evaluations"):
    """Score (mean ± std) and laps finished against decisions (left) and minutes of training (right)."""
    fig = new_figure((9.0, 3.4))
    axes = fig.subplots(1, 2, sharey=True)
    steps = np.array([p.timesteps for p in points], dtype=float)
    minutes = np.array([p.seconds / 60 for p in points])
    mean = np.array([p.score_mean for p in points])
    std = np.array([p.score_std for p in points])
    laps = np.array([p.lap_rate for p in points])
    for ax, x, label in ((axes[0], steps / 1e3, "decisions (thousands)"), (axes[1], minutes, "minutes of training")):
        ax.plot(x, mean, marker="o", markersize=3, color="C0", label="score")
        ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.2)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot(x, 100 * laps, color="C1", linestyle="--", label="laps finished")
        twin.set_ylim(0, 105)
        twin.set_ylabel("laps finished (%)", color="C1")
    axes[0].set_ylabel("score")
    fig.suptitle(title, fontsize=10)
    return fig


def new_curve_recorder(folder: str | Path, save_best: Callable[[], None]) -> Any:
    """An SB3 callback for ``EvalCallback(callback_after_eval=...)`` that extends the curve in
    ``folder`` and calls ``save_best`` when the evaluation just run is the best so far. It reads
    the episodes' scores and successes that EvalCallback keeps only when given a ``log_path``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class CurveRecorder(BaseCallback):
        """Appends the evaluation just run to the curve, redraws it, and keeps the best model."""

        def __init__(self) -> None:
            super().__init__()
            self.folder = Path(folder)
            self.points = read_curve(self.folder)
            self.start = time.monotonic() - (self.points[-1].seconds if self.points else 0.0)

        def _init_callback(self) -> None:
            if getattr(self.parent, "log_path", None) is None:
                raise ValueError("the learning-curve recorder needs EvalCallback(log_path=...): without it the "
                                 "evaluation keeps no per-episode scores or successes")

        def _on_step(self) -> bool:
            evaluation = self.parent
            scores = np.asarray(evaluation.evaluations_results[-1], dtype=float)
            successes = evaluation.evaluations_successes[-1] if evaluation.evaluations_successes else []
            self.points.append(CurvePoint(
                timesteps=int(self.num_timesteps), seconds=round(time.monotonic() - self.start, 1),
                score_mean=float(scores.mean()), score_std=float(scores.std()),
                lap_rate=float(np.mean(successes)) if len(successes) else 0.0))
            if best_point(self.points) is self.points[-1]:
                save_best()
            write_curve(self.folder, self.points)
            return True

    return CurveRecorder()
