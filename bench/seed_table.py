"""Closed-loop results across training seeds, as the results tables give them: laps per seed,
then mean ± std over the seeds, per run recipe, condition and action setting.

    python -m bench.seed_table EVAL_DIR... [--tracks 42,1000-1009]
    python -m bench.seed_table EVAL_DIR... --results STUDY --table NAME --caption TEXT \
        --config configs/quality.json --command "nsacdrive eval ..." [--command ...] [--title TITLE]

With ``--results`` the table is also written into ``results/<STUDY>.json`` (replacing the table of
that name) with the provenance of this checkout and machine: the ``--command`` lines that made the
evaluations, then this command; the ``--config`` files' hashes; the training seeds of its rows.

Runs are matched across seeds by their path: the first ``-sN`` in a run's path names its training
seed and the rest of the path its recipe (``runs/ql/levy-s0`` and ``runs/ql/levy-s1`` are seeds 0
and 1 of ``runs/ql/levy``; ``runs/qs-dagger-s2/runs/round-1`` is seed 2 of
``runs/qs-dagger/runs/round-1``). A run path without one is a recipe of its own with seed "-".
Laps are the share of episodes that finished the lap; the std is the sample std (ddof 1) over
the seeds, blank for one seed. ``--tracks`` keeps the episodes of those track seeds only, so one
evaluation over protocol and unseen tracks gives a table for each.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import REPO, ResultsError, current_provenance, put_table, recorded_arguments, render_table
from nsacdrive.common.seeds import parse_seeds
from nsacdrive.envs.corruptions import NO_CORRUPTION
from nsacdrive.eval.results import EvaluationError, describe_action_settings, load_aggregates, load_records

SEED_TOKEN = re.compile(r"-s(\d+)(?=$|/)")


def recipe_and_seed(run: str) -> tuple[str, str]:
    """(recipe, training seed) named by a run path; seed "-" when the path names none."""
    match = SEED_TOKEN.search(run)
    if match is None:
        return run, "-"
    return run[:match.start()] + run[match.end():], match.group(1)


@dataclass(frozen=True)
class Row:
    """One table row: a recipe under one condition and action setting, with its per-seed figures."""

    recipe: str
    condition: str
    actions: str
    seeds: tuple[str, ...]
    laps: tuple[float, ...]  # per seed, in [0, 1]
    episodes: tuple[int, ...]  # per seed
    scores: tuple[float, ...]  # per seed: mean score
    lateral: tuple[float, ...]  # per seed: mean |lateral error| over its finished laps (nan: none)


def _condition(record: dict[str, Any]) -> str:
    corruption = record.get("corruption", NO_CORRUPTION)
    return record["colour_preset"] if corruption == NO_CORRUPTION else f"{record['colour_preset']} + {corruption}"


def collect_rows(eval_dirs: list[Path], tracks: set[int] | None = None) -> list[Row]:
    """Every (recipe, condition, action setting) of the evaluations, its episodes grouped by training seed."""
    groups: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for eval_dir in eval_dirs:
        actions = describe_action_settings(load_aggregates(eval_dir))
        for record in load_records(eval_dir):
            if tracks is not None and int(record["track_seed"]) not in tracks:
                continue
            recipe, seed = recipe_and_seed(str(record["run"]))
            groups[(recipe, _condition(record), actions)][seed].append(record)
    rows = []
    for (recipe, condition, actions), by_seed in sorted(groups.items()):
        seeds = tuple(sorted(by_seed, key=lambda s: (s == "-", int(s) if s.isdigit() else 0)))
        episodes = [by_seed[s] for s in seeds]
        rows.append(Row(recipe, condition, actions, seeds,
                        laps=tuple(float(np.mean([r["lap_finished"] for r in e])) for e in episodes),
                        episodes=tuple(len(e) for e in episodes),
                        scores=tuple(float(np.mean([r["score"] for r in e])) for e in episodes),
                        lateral=tuple(_lap_lateral(e) for e in episodes)))
    return rows


def _lap_lateral(records: list[dict[str, Any]]) -> float:
    laps = [r["mean_abs_lateral_error"] for r in records if r["lap_finished"]]
    return float(np.mean(laps)) if laps else float("nan")


def spread(values: tuple[float, ...] | list[float], digits: int, scale: float = 1.0) -> str:
    """``mean ± sample std`` of the finite values (× ``scale``), the mean alone for one value, ``–`` for none."""
    finite = np.array([v for v in values if np.isfinite(v)]) * scale
    if not len(finite):
        return "–"
    text = f"{finite.mean():.{digits}f}"
    return text if len(finite) < 2 else f"{text} ± {finite.std(ddof=1):.{digits}f}"


COLUMNS = ("run", "condition", "actions", "seeds", "laps per seed (%)", "laps mean ± std (%)", "score", "|lat| (laps)",
           "episodes")


def table_cells(row: Row) -> list[str]:
    """One row's cells, in the order of :data:`COLUMNS`."""
    return [row.recipe, row.condition, row.actions, ", ".join(row.seeds), " / ".join(f"{100 * lap:.0f}" for lap in row.laps),
            spread(row.laps, 0, 100), spread(row.scores, 1), spread(row.lateral, 2), " / ".join(map(str, row.episodes))]


def format_table(rows: list[Row]) -> str:
    """A markdown table: laps per seed (mean ± std), mean score and |lat| on finished laps."""
    return render_table(list(COLUMNS), [table_cells(row) for row in rows])


def results_table(rows: list[Row], name: str, caption: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """The rows as a table of a results file (:mod:`bench.results`)."""
    return {"name": name, "caption": caption, "columns": list(COLUMNS), "rows": [table_cells(row) for row in rows],
            "provenance": provenance}


def training_seeds(rows: list[Row]) -> list[int | str]:
    """The training seeds the rows hold, numbers first, in order."""
    seeds = {seed for row in rows for seed in row.seeds}
    return [*sorted(int(s) for s in seeds if s.isdigit()), *sorted(s for s in seeds if not s.isdigit())]


def main(argv: list[str] | None = None, root: Path = REPO) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_dirs", nargs="+", type=Path, metavar="EVAL_DIR", help="folders written by `nsacdrive eval`")
    parser.add_argument("--tracks", help="keep these track seeds only, e.g. 42,1000-1009")
    parser.add_argument("--results", metavar="STUDY", help="also write the table into results/STUDY.json")
    parser.add_argument("--title", help="the study's title, should results/STUDY.json not exist yet")
    parser.add_argument("--table", help="the table's name in that file (with --results)")
    parser.add_argument("--caption", default="", help="what the rows are (with --results; Markdown)")
    parser.add_argument("--config", action="append", default=[], help="a recipe config the runs were trained with (repeatable)")
    parser.add_argument("--command", action="append", default=[], help="a command that made the evaluations (repeatable)")
    args = parser.parse_args(argv)
    if args.results is not None and not args.table:
        parser.error("--results needs --table, the name of the table to write")
    try:
        tracks = None if args.tracks is None else set(parse_seeds(args.tracks, "--tracks"))
        rows = collect_rows(args.eval_dirs, tracks)
    except (EvaluationError, ValueError) as exc:
        parser.error(str(exc))
    if not rows:
        parser.error("no episodes matched (check --tracks)")
    print(format_table(rows))
    if args.results is not None:
        command = "python -m bench.seed_table " + shlex.join(recorded_arguments(
            sys.argv[1:] if argv is None else argv, flags=(), options=("--command",)))
        try:
            provenance = current_provenance([*args.command, command], args.config, training_seeds(rows), root)
            path = put_table(args.results, results_table(rows, args.table, args.caption, provenance), root, args.title)
        except ResultsError as exc:
            parser.error(str(exc))
        print(f"wrote the table {args.table!r} into {path}")


if __name__ == "__main__":
    main()
