"""What the safety layer costs on nominal driving: the closed loop with a monitor and a fallback
against the controller alone, the same episodes, side by side in one run.

    python -m bench.safety_cost [--run RUN] [--quick]

Each side drives the same tracks (inline, one worker, one lockstep group) with ``--fallback stop``
armed on a threshold no score reaches, so the monitor computes every step and the fallback never
acts: the cost of watching, not of a different drive. Sides: the controller alone; one smoothed
score (``steer_std``; with a calibrated ``--run``, the ``density`` too); the learned failure predictor
over every score the run logs. Without ``--run`` an untrained run of the quality recipe drives.
Rounds alternate the sides, so a load spike hits every side of a round; ratios are medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.closed_loop_speed import untrained_run
from bench.common import print_table, save_results
from bench.results import Layout, current_provenance, put_table, render
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop
from nsacdrive.eval.monitor_scores import SCORES
from nsacdrive.eval.predictor_features import FEATURES, FailurePredictor

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = 1e30
STEPS = 300


def predictor_over(scores: list[str]) -> FailurePredictor:
    """A predictor with arbitrary weights over ``scores``: its cost does not depend on what it learned."""
    width = len(scores) * len(FEATURES)
    rng = np.random.default_rng(0)
    return FailurePredictor(tuple(scores), tuple(np.zeros(width)), tuple(np.ones(width)), tuple(rng.normal(0, 0.1, width)), 0.0, 3.0)


def sides(has_density: bool) -> dict[str, DriveConfig]:
    """Drive configs by name: the controller alone, then each monitor armed with ``stop`` on an unreachable threshold."""
    def armed(score: str, **predictor: FailurePredictor) -> DriveConfig:
        return DriveConfig(max_steps=STEPS, monitor_score=score, monitor_threshold=UNREACHABLE, fallback="stop", **predictor)

    scores = [name for name in SCORES if name != "curvature" and (has_density or name != "density")]
    out = {"controller alone": DriveConfig(max_steps=STEPS), "+ monitor steer_std, fallback stop": armed("steer_std")}
    if has_density:
        out["+ monitor density, fallback stop"] = armed("density")
    out[f"+ failure predictor over {len(scores)} scores, fallback stop"] = armed(
        "failure_predictor", monitor_predictor=predictor_over(scores))
    return out


def timed(run: Path, drive: DriveConfig, seeds: tuple[int, ...]) -> float:
    """Seconds to drive ``seeds`` with ``drive`` (one lockstep group, inline)."""
    with tempfile.TemporaryDirectory() as folder:
        config = EvalConfig(runs=(str(run),), seeds=seeds, drive=drive, batch=len(seeds))
        start = time.perf_counter()
        evaluate_closed_loop(config, Path(folder), progress=False)
        return time.perf_counter() - start



def results_table(rows: list[tuple[str, str]], seeds: tuple[int, ...], rounds: int, args: argparse.Namespace) -> dict:
    """The table for ``results/benchmarks.json``, with this run's provenance."""
    command = "python -m bench.safety_cost" + (f" --run {args.run}" if args.run else "") + (" --quick" if args.quick else "") + " --results"
    machine = current_provenance([command], [ROOT / "configs" / "quality.json"] if not args.run else [], [])
    return {"name": "Safety layer on nominal driving", "provenance": machine,
            "caption": (f"`bench.safety_cost`: {len(seeds)} held-out tracks × {STEPS} steps in one lockstep group, inline; "
                        f"seconds and the ratio to the controller alone, median of {rounds} alternated rounds (the rounds' range). "
                        "The monitors compute every step; the fallback is armed on a threshold no score reaches."),
            "columns": ["side", "seconds, ratio"], "rows": [list(row) for row in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a run folder (calibrated for the density); default: an untrained quality run")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and tracks (a smoke run)")
    parser.add_argument("--results", action="store_true",
                        help="also put the table, with this machine's provenance, into results/benchmarks.json")
    args = parser.parse_args()
    rounds, seeds = (2, (42, 1000)) if args.quick else (5, (42, 1000, 1001, 1002))
    with tempfile.TemporaryDirectory() as folder:
        run = args.run or untrained_run(ROOT / "configs" / "quality.json", Path(folder) / "run")
        configs = sides((Path(run) / "density.safetensors").is_file())
        timed(run, configs["controller alone"], seeds[:1])  # warm-up: imports, first allocations
        seconds: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(rounds):
            for name, drive in configs.items():
                seconds[name].append(timed(run, drive, seeds))
    alone = seconds["controller alone"]
    rows, results = [], {}
    for name, times in seconds.items():
        ratios = [t / a for t, a in zip(times, alone)]
        results[name] = {"seconds": times, "ratio_median": statistics.median(ratios)}
        rows.append((name, f"{statistics.median(times):.2f} s, ×{statistics.median(ratios):.3f} "
                           f"(rounds ×{min(ratios):.3f}–{max(ratios):.3f})"))
    print_table(f"safety layer on nominal driving: {len(seeds)} tracks × {STEPS} steps, median of {rounds} rounds", rows)
    if args.results:
        put_table("benchmarks", results_table(rows, seeds, rounds, args), ROOT)
        render(Layout.of(ROOT))
    save_results("safety_cost", args.quick, {"run": str(args.run) if args.run else "untrained quality recipe",
                                             "tracks": list(seeds), "steps": STEPS, "rounds": rounds, **results})


if __name__ == "__main__":
    main()
