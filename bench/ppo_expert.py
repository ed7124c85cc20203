"""Does the state-PPO expert lap: its shipped recipe trained for several seeds, judged on held-out tracks.

    python -m bench.ppo_expert                                  # seeds 0-2, the shipped recipe
    python -m bench.ppo_expert --seeds 0 --timesteps 200000     # a short screen

For each seed, ``nsacdrive expert train --obs state --seed S`` into ``OUT/state-sS`` (a folder
that already holds a finished training of that length is kept), then ``nsacdrive expert
evaluate --agent ppo:OUT/state-sS/best`` on the held-out tracks 1000–1099. The evaluation tracks
that choose ``best/`` during training are the training seed's own (never 1000–1099).

Three tables go to ``results/ppo-expert.json``: per seed, the held-out score, laps finished and
|lateral error| beside the decisions and minutes at which ``best/`` was saved and the whole
training's minutes; the periodic evaluations of every seed (each folder also keeps its
``eval/curve.png``); and how smooth each seed's labels are beside the pure-pursuit expert's,
measured as :mod:`bench.teacher_smoothness` measures teachers (tracks 0–27 clean, with action
noise 0.2, and under a poor learner; saved to ``OUT/labels.json``, which ``--written`` reads
back). Then the docs are rendered.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import as_recorded
from bench.ppo_commands import ppo_commands
from bench.results import REPO, Layout, current_provenance, put_table, recorded_arguments, render
from bench.seed_table import spread
from bench.teacher_smoothness import CONDITIONS, LABEL_TRACKS, record, smoothness
from nsacdrive.agents.ppo_config import PPOConfig
from nsacdrive.agents.ppo_curve import CurvePoint, best_point, read_curve
from nsacdrive.agents.ppo_policy import POLICY_FILE
from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.common.seeds import format_seeds, parse_seeds

HELD_OUT = "1000-1099"
HELD_OUT_FILE = "held-out.json"
LABELS_FILE = "labels.json"
STUDY = "ppo-expert"
SEEDS_ROW = "mean ± std over seeds"
#: the label statistics of the smoothness table: (column, key in bench.teacher_smoothness.smoothness, digits)
LABEL_COLUMNS = (("mean \\|Δsteer\\| per step", "mean_abs_change", 4), ("99th percentile \\|Δsteer\\|", "p99_abs_change", 3),
                 ("steer sign flips per 100 steps", "sign_flips_per_100", 2), ("steps at full lock (%)", "wheel_lock_pct", 1),
                 ("mean gas", "mean_gas", 2), ("steps braking (%)", "braking_pct", 1), ("laps finished (%)", "lap_finished_pct", 0))


def trained_steps(folder: Path) -> int:
    """Decisions the finished training in ``folder`` ran (0 when it has not finished)."""
    path = folder / POLICY_FILE
    return int(json.loads(path.read_text())["num_timesteps"]) if path.is_file() else 0


def seed_row(seed: int, held_out: dict[str, Any], points: list[CurvePoint]) -> list[Any]:
    """One seed's cells of the held-out table."""
    best = best_point(points)
    agg = held_out["aggregate"]
    return [seed, f"{agg['score_mean']:.1f} ± {agg['score_std']:.1f}", round(agg["score_min"], 1),
            f"{100 * agg['lap_finished_rate']:.0f} %", round(agg["mean_abs_lateral_error"], 2),
            f"{best.timesteps // 1000}k", round(best.seconds / 60, 1), round(points[-1].seconds / 60, 1)]


def seeds_row(held_outs: list[dict[str, Any]], curves: list[list[CurvePoint]]) -> list[Any]:
    """Mean ± sample std over the training seeds of each seed's held-out mean score and laps."""
    aggs = [h["aggregate"] for h in held_outs]
    return [SEEDS_ROW, spread([a["score_mean"] for a in aggs], 1), round(min(a["score_min"] for a in aggs), 1),
            f"{spread([a['lap_finished_rate'] for a in aggs], 0, 100)} %",
            round(float(np.mean([a["mean_abs_lateral_error"] for a in aggs])), 2), None,
            round(float(np.mean([best_point(c).seconds / 60 for c in curves])), 1),
            round(float(np.mean([c[-1].seconds / 60 for c in curves])), 1)]


def curve_rows(curves: dict[int, list[CurvePoint]]) -> list[list[Any]]:
    """Rows of the periodic-evaluations table: one per evaluation step, ``score / laps`` per seed."""
    steps = sorted({p.timesteps for points in curves.values() for p in points})
    rows = []
    for step in steps:
        cells = []
        for points in curves.values():
            point = next((p for p in points if p.timesteps == step), None)
            cells.append(None if point is None else f"{point.score_mean:.0f} / {100 * point.lap_rate:.0f} %")
        rows.append([f"{step // 1000}k", *cells])
    return rows


def label_stats(teachers: dict[str, str], cache: Path, written: bool) -> dict[str, dict[str, dict[str, float]]]:
    """Agent spec → condition → the smoothness of the labels it gives (``teachers``: name → spec).
    They are measured and saved to ``cache`` with the tracks and conditions that produced them;
    ``written`` reads back those of the same tracks and conditions and measures only the teachers missing."""
    made_on = {"tracks": LABEL_TRACKS, "conditions": [condition.name for condition in CONDITIONS]}
    saved = json.loads(cache.read_text()) if written and cache.is_file() else {}
    stats = saved.get("teachers", {}) if all(saved.get(key) == value for key, value in made_on.items()) else {}
    missing = [spec for spec in teachers.values() if spec not in stats]
    for spec in missing:
        stats[spec] = {condition.name: smoothness(record(spec, LABEL_TRACKS, condition)) for condition in CONDITIONS}
    if missing:
        atomic_write_json(cache, made_on | {"teachers": stats})
    return stats


def label_rows(teachers: dict[str, str], stats: dict[str, dict[str, dict[str, float]]]) -> list[list[Any]]:
    """One row per condition and teacher (``teachers``: name → agent spec)."""
    return [[name, condition.name, *(round(stats[spec][condition.name][key], digits) for _, key, digits in LABEL_COLUMNS)]
            for condition in CONDITIONS for name, spec in teachers.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-2", help="training seeds")
    parser.add_argument("--timesteps", type=int, default=PPOConfig.state_recipe().timesteps, help="decisions per training")
    parser.add_argument("--out", type=Path, default=Path("runs/ppo"))
    parser.add_argument("--workers", type=int, default=2, help="processes of the held-out evaluation")
    parser.add_argument("--written", action="store_true", help="read the trainings and evaluations as an earlier call left them")
    parser.add_argument("--note", default=None, help="what a reader must know about how the runs were made (e.g. shared cores)")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds, "--seeds")
    commands, rows, curves, held_outs = [], [], {}, []
    for seed in seeds:
        folder = args.out / f"state-s{seed}"
        train, evaluate = ppo_commands("state", seed, args.timesteps, folder, HELD_OUT, folder / HELD_OUT_FILE, workers=args.workers)
        if not args.written:
            done = trained_steps(folder)
            if done < args.timesteps:
                if folder.exists():
                    raise SystemExit(f"{folder} holds an unfinished training ({done} of {args.timesteps} decisions): "
                                     f"remove it, or continue it with `nsacdrive expert train --resume`")
                subprocess.run(train, check=True)
            subprocess.run(evaluate, check=True)
        commands += [as_recorded(train), as_recorded(evaluate)]
        curves[seed] = read_curve(folder / "eval")
        if not curves[seed]:
            raise SystemExit(f"{folder / 'eval'} has no periodic evaluations: train with evaluation on")
        held_outs.append(json.loads((folder / HELD_OUT_FILE).read_text()))
        rows.append(seed_row(seed, held_outs[-1], curves[seed]))
    rows.append(seeds_row(held_outs, list(curves.values())))
    own = recorded_arguments(sys.argv[1:] if argv is None else argv)
    commands.append(shlex.join(["python", "-m", "bench.ppo_expert", *own]))
    provenance = current_provenance(commands, [], seeds, note=args.note)
    label = f"training seeds {format_seeds(seeds)}, {args.timesteps // 1000}k decisions"
    held_out = {
        "name": f"State recipe on held-out tracks, {label}",
        "caption": f"`nsacdrive expert evaluate` of each seed's `best/` on tracks {HELD_OUT}. Targets: mean score ≥ 910 "
                   "and ≥ 95 % laps finished for every seed, trained in ≤ 1 hour on 2 cores.",
        "columns": ["training seed", "score (mean ± std)", "min", "laps finished", "mean \\|lateral error\\|",
                    "best/ at (decisions)", "best/ at (minutes)", "training (minutes)"],
        "rows": rows,
        "provenance": provenance,
    }
    curve = {
        "name": f"State recipe, periodic evaluations, {label}",
        "caption": "Mean score / laps finished of the periodic evaluations on each seed's own evaluation tracks "
                   "(`eval/curve.json` and `eval/curve.png` in each run folder).",
        "columns": ["decisions", *(f"seed {seed}" for seed in seeds)],
        "rows": curve_rows(curves),
        "provenance": provenance,
    }
    teachers = {"pure-pursuit expert": "expert", **{f"PPO seed {seed}": f"ppo:{args.out / f'state-s{seed}' / 'best'}" for seed in seeds}}
    labels = {
        "name": f"State recipe's labels beside the pure-pursuit expert's, {label}",
        "caption": "Labels on tracks 0–27 as `bench.teacher_smoothness` records them: driven clean, with executed-action noise "
                   "σ = 0.2, and by a poor learner half of the time (what DAgger asks a teacher to label).",
        "columns": ["teacher", "states", *(column for column, _, _ in LABEL_COLUMNS)],
        "rows": label_rows(teachers, label_stats(teachers, args.out / LABELS_FILE, args.written)),
        "provenance": provenance,
    }
    for table in (held_out, curve, labels):
        path = put_table(STUDY, table, REPO)
    render(Layout.of(REPO))
    print(f"→ {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
