"""Do a teacher's students drive: ``make demo``'s recipe on one teacher's demonstrations, per seed.

    python -m bench.teacher_students expert                          # the pure-pursuit expert
    python -m bench.teacher_students ppo:runs/ppo/state-s0/best      # a PPO expert
    python -m bench.teacher_students expert ppo:runs/ppo/state-s0/best --written   # the table only

For each teacher, the steps of ``make demo`` with that teacher in every place the pure-pursuit
expert has there: it records tracks 0–31 clean, 0–27 with action noise 0.2 and 30–31 under
``shift-3`` (``nsacdrive collect --agent TEACHER``); NSAC students train on them
(``nsacdrive sweep --config configs/demo.json``, one per training seed); one DAgger round with
the teacher as the labeller fine-tunes each (``--expert TEACHER``; the teacher reads the state,
so it labels any state the student reaches); the students drive the held-out tracks 42 and
1000–1009, default colours and ``shift-3``. Every step resumes. The table (laps per training
seed and their mean ± std, after behaviour cloning and after the DAgger round) goes to ``results/ppo-expert.json``
with its provenance, then the docs are rendered.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

from bench.results import REPO, Layout, current_provenance, put_table, recorded_arguments, render
from bench.seed_table import Row, collect_rows, recipe_and_seed, spread
from nsacdrive.common.seeds import format_seeds, parse_seeds

NSACDRIVE = str(Path(sys.executable).with_name("nsacdrive"))
RECIPE = "configs/demo.json"
#: what ``make demo`` records: (track seeds, extra collect options)
DEMONSTRATIONS = (("0-31", ()), ("0-27", ("--noise", "0.2")), ("30-31", ("--colour-preset", "shift-3")))
DAGGER = ("--rounds", "1", "--episodes-per-round", "16", "--lr", "0.00025")
HELD_OUT, PRESETS = "42,1000-1009", ("default", "shift-3")
STAGES = (("behaviour cloning", "bc"), ("after the DAgger round", "dagger"))


def teacher_name(spec: str) -> str:
    """A folder name for a teacher spec: ``ppo:runs/ppo/state-s0/best`` → ``ppo_runs_ppo_state_s0_best`` (no
    ``-sN`` in it: that names a student's training seed)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", spec).strip("_")


def dagger_folder(folder: Path, seed: int) -> Path:
    """Where the DAgger round of one training seed's student writes."""
    return folder / f"dagger-s{seed}"


def student_runs(folder: Path, seeds: list[int]) -> dict[str, list[Path]]:
    """Each stage's student run folders, one per training seed."""
    return {"bc": [folder / f"nsac-s{seed}" for seed in seeds],
            "dagger": [dagger_folder(folder, seed) / "runs" / "round-1" for seed in seeds]}


def laps_cell(rows: list[Row], run: Path, preset: str, seeds: list[int]) -> str:
    """``a / b / c of N (mean ± std %)``: one stage's laps per training seed under one colour preset
    (``–`` where a seed's run was not driven)."""
    recipe, _ = recipe_and_seed(str(run))
    row = next((r for r in rows if r.recipe == recipe and r.condition == preset), None)
    by_seed = {} if row is None else dict(zip(row.seeds, zip(row.laps, row.episodes, strict=True), strict=True))
    cells = [by_seed.get(str(seed)) for seed in seeds]
    counts = " / ".join("–" if c is None else str(round(c[0] * c[1])) for c in cells)
    episodes = {c[1] for c in cells if c is not None}
    driven = [c[0] for c in cells if c is not None]
    return counts + (f" of {episodes.pop()}" if len(episodes) == 1 else "") + (f" ({spread(driven, 0, 100)} %)" if driven else "")


def commands_for(teacher: str, data: Path, folder: Path, seeds: list[int], workers: int) -> list[list[str]]:
    """Every step of one teacher's students, in order."""
    steps = [[NSACDRIVE, "collect", "--agent", teacher, "--seeds", tracks, *extra, "--out", str(data), "--workers", str(workers),
              "--resume"] for tracks, extra in DEMONSTRATIONS]
    steps.append([NSACDRIVE, "sweep", "--config", RECIPE, "--data", str(data), "--seeds", format_seeds(seeds), "--models", "nsac",
                  "--workers", str(workers), "--out", str(folder)])
    runs = student_runs(folder, seeds)
    for seed, init in zip(seeds, runs["bc"], strict=True):
        steps.append([NSACDRIVE, "dagger", "--init", str(init), *DAGGER, "--expert", teacher, "--workers", str(workers),
                      "--out", str(dagger_folder(folder, seed))])
    for runs_driven, out in eval_groups(folder, seeds):  # one evaluation cannot hold two runs of one name (round-1)
        steps.append([NSACDRIVE, "eval", *map(str, runs_driven), "--seeds", HELD_OUT, "--colour-preset", ",".join(PRESETS),
                      "--workers", str(workers), "--out", str(out), "--resume"])
    return steps


def eval_groups(folder: Path, seeds: list[int]) -> list[tuple[list[Path], Path]]:
    """(student runs, evaluation folder): the behaviour-cloned students together, each DAgger student alone."""
    runs = student_runs(folder, seeds)
    return [(runs["bc"], folder / "eval" / "bc"),
            *(([run], folder / "eval" / f"dagger-s{seed}") for seed, run in zip(seeds, runs["dagger"], strict=True))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teachers", nargs="+", help="agent specs: expert, expert:smooth, ppo:DIR")
    parser.add_argument("--seeds", default="0-2", help="the students' training seeds")
    parser.add_argument("--data", type=Path, default=Path("data/students"), help="demonstrations go to DATA/<teacher>")
    parser.add_argument("--out", type=Path, default=Path("runs/students"), help="students go to OUT/<teacher>")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--written", action="store_true", help="read the evaluations as an earlier call left them")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds, "--seeds")
    commands, rows = [], []
    for teacher in args.teachers:
        folder = args.out / teacher_name(teacher)
        for step in commands_for(teacher, args.data / teacher_name(teacher), folder, seeds, args.workers):
            if not args.written:
                subprocess.run(step, check=True)
            commands.append(shlex.join(["nsacdrive", *step[1:]]))
        driven = collect_rows([out for _, out in eval_groups(folder, seeds)])
        runs = student_runs(folder, seeds)
        for stage, key in STAGES:
            rows.append([f"`{teacher}`", stage, *(laps_cell(driven, runs[key][0], preset, seeds) for preset in PRESETS)])
    own = recorded_arguments(sys.argv[1:] if argv is None else argv)
    commands.append(shlex.join(["python", "-m", "bench.teacher_students", *own]))
    table = {
        "name": f"Students of each teacher, training seeds {format_seeds(seeds)}: {', '.join(args.teachers)}",
        "caption": f"`make demo`'s recipe (`{RECIPE}` and one DAgger round at lr 2.5e-4) on each teacher's demonstrations, "
                   f"the teacher labelling the DAgger round; laps per training seed on tracks {HELD_OUT}.",
        "columns": ["teacher", "student", *PRESETS],
        "rows": rows,
        "provenance": current_provenance(commands, [RECIPE], seeds),
    }
    path = put_table("ppo-expert", table, REPO)
    render(Layout.of(REPO))
    print(f"→ {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
