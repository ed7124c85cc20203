"""Do a teacher's students drive: a recipe's students trained on one teacher's demonstrations, per seed.

    python -m bench.teacher_students expert                          # the pure-pursuit expert
    python -m bench.teacher_students ppo:runs/ppo/state-s0/best      # a PPO expert
    python -m bench.teacher_students ppo:runs/ppo/state-s0/best --view front   # its front-camera students
    python -m bench.teacher_students expert ppo:runs/ppo/state-s0/best --written   # the table only

``--view carracing`` (default) runs the steps of ``make demo`` with that teacher in every place the
pure-pursuit expert has there: it records tracks 0–31 clean, 0–27 with action noise 0.2 and 30–31
under ``shift-3`` (``nsacdrive collect --agent TEACHER``); NSAC students train on them (``nsacdrive
sweep --config configs/demo.json``, one per training seed); one DAgger round with the teacher as the
labeller fine-tunes each (``--expert TEACHER``; the teacher reads the state, so it labels any state
the student reaches). ``--view front`` runs the front-camera recipe of the user guide: the teacher
drives and labels the Udacity-style camera on tracks 0–59, side cameras 2 units out, clean and with
action noise 0.2; students train with ``configs/front-camera.json`` and are fine-tuned with β-NLL
(``configs/front-camera-bnll.json``), then drive with pedal caution 0.5. The students drive the
held-out tracks 42 and 1000–1009 (``--stage development``: tracks 3000–3010, to compare teachers
and recipes without touching them), default colours and ``shift-3``. Every step resumes. The table
(laps per training seed and their mean ± std, per stage) goes to ``results/ppo-expert.json`` with
its provenance, then the docs are rendered.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common import NSACDRIVE_SCRIPT, as_recorded
from bench.results import REPO, Layout, current_provenance, put_table, recorded_arguments, render
from bench.seed_table import Row, collect_rows, recipe_and_seed, spread
from nsacdrive.common.seeds import format_seeds, parse_seeds

#: the tracks students drive: ``development`` to compare teachers and recipes, ``protocol`` (held out) to report
STAGE_TRACKS = {"development": "3000-3010", "protocol": "42,1000-1009"}
PRESETS = ("default", "shift-3")


@dataclass(frozen=True)
class StudentRecipe:
    """How one view's students learn from a teacher: what is recorded, the behaviour-cloning config,
    the second stage (a DAgger round the teacher labels, or a fine-tune with ``fine_tune``'s config)
    and how the students drive."""

    title: str  # names the results table
    description: str  # its caption
    folder_suffix: str  # of the teacher's data and student folders
    collect_options: tuple[str, ...]  # the env of the demonstrations
    demonstrations: tuple[tuple[str, tuple[str, ...]], ...]  # (track seeds, extra collect options)
    config: str
    second_stage: str  # its row label
    fine_tune: str | None = None  # None: one DAgger round
    drive_options: tuple[str, ...] = ()


DAGGER = ("--rounds", "1", "--episodes-per-round", "16", "--lr", "0.00025")
RECIPES = {
    "carracing": StudentRecipe("Students", "`make demo`'s recipe (`configs/demo.json` and one DAgger round at lr 2.5e-4) on each "
                               "teacher's demonstrations, the teacher labelling the DAgger round", "", (),
                               (("0-31", ()), ("0-27", ("--noise", "0.2")), ("30-31", ("--colour-preset", "shift-3"))),
                               "configs/demo.json", "after the DAgger round"),
    "front": StudentRecipe("Front-camera students", "The front-camera recipe (`configs/front-camera.json`, then the β-NLL "
                           "fine-tune `configs/front-camera-bnll.json` from each seed's run) on each teacher's demonstrations "
                           "of the Udacity-style camera, driven with `--pedal-caution 0.5`", "_front",
                           ("--env", "udacity-style", "--side-offset", "2"),
                           (("0-59", ()), ("0-59", ("--noise", "0.2"))), "configs/front-camera.json",
                           "after the β-NLL fine-tune", fine_tune="configs/front-camera-bnll.json",
                           drive_options=("--pedal-caution", "0.5")),
}


def teacher_name(spec: str) -> str:
    """A folder name for a teacher spec: ``ppo:runs/ppo/state-s0/best`` → ``ppo_runs_ppo_state_s0_best`` (no
    ``-sN`` in it: that names a student's training seed)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", spec).strip("_")


def second_stage_folder(folder: Path, recipe: StudentRecipe, seed: int) -> Path:
    """Where the second stage of one training seed's student writes."""
    return folder / (f"dagger-s{seed}" if recipe.fine_tune is None else f"fine-tune-s{seed}")


def student_runs(folder: Path, recipe: StudentRecipe, seeds: list[int]) -> dict[str, list[Path]]:
    """Each stage's student run folders (``bc``, ``second``), one per training seed."""
    runs = [second_stage_folder(folder, recipe, seed) for seed in seeds]
    return {"bc": [folder / f"nsac-s{seed}" for seed in seeds],
            "second": runs if recipe.fine_tune else [run / "runs" / "round-1" for run in runs]}


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


def commands_for(teacher: str, recipe: StudentRecipe, data: Path, folder: Path, seeds: list[int], workers: int,
                 stage: str = "protocol") -> list[list[str]]:
    """Every step of one teacher's students, in order, driven on ``stage``'s tracks."""
    steps = [[NSACDRIVE_SCRIPT, "collect", *recipe.collect_options, "--agent", teacher, "--seeds", tracks, *extra, "--out", str(data),
              "--workers", str(workers), "--resume"] for tracks, extra in recipe.demonstrations]
    steps.append([NSACDRIVE_SCRIPT, "sweep", "--config", recipe.config, "--data", str(data), "--seeds", format_seeds(seeds),
                  "--models", "nsac", "--workers", str(workers), "--out", str(folder)])
    for seed, init in zip(seeds, student_runs(folder, recipe, seeds)["bc"], strict=True):
        out = str(second_stage_folder(folder, recipe, seed))
        if recipe.fine_tune is None:
            steps.append([NSACDRIVE_SCRIPT, "dagger", "--init", str(init), *DAGGER, "--expert", teacher, "--workers", str(workers), "--out", out])
        else:
            steps.append([NSACDRIVE_SCRIPT, "train", "--config", recipe.fine_tune, "--data", str(data), "--init-from", str(init),
                          "--seed", str(seed), "--out", out, "--resume"])
    for runs_driven, out in eval_groups(folder, recipe, seeds, stage):
        steps.append([NSACDRIVE_SCRIPT, "eval", *map(str, runs_driven), "--seeds", STAGE_TRACKS[stage], "--colour-preset", ",".join(PRESETS),
                      *recipe.drive_options, "--workers", str(workers), "--out", str(out), "--resume"])
    return steps


def eval_groups(folder: Path, recipe: StudentRecipe, seeds: list[int], stage: str = "protocol") -> list[tuple[list[Path], Path]]:
    """(student runs, evaluation folder): the behaviour-cloned students together, each second-stage
    student alone (one evaluation cannot hold two runs of one name, such as DAgger's round-1)."""
    runs, evaluations = student_runs(folder, recipe, seeds), folder / ("eval" if stage == "protocol" else f"eval-{stage}")
    return [(runs["bc"], evaluations / "bc"),
            *(([run], evaluations / second_stage_folder(folder, recipe, seed).name)
              for seed, run in zip(seeds, runs["second"], strict=True))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teachers", nargs="+", help="agent specs: expert, expert:smooth, ppo:DIR")
    parser.add_argument("--view", choices=sorted(RECIPES), default="carracing", help="the students' camera and recipe")
    parser.add_argument("--stage", choices=sorted(STAGE_TRACKS), default="protocol",
                        help="development: tracks to choose teachers and recipes on; protocol: the held-out tracks to report")
    parser.add_argument("--seeds", default="0-2", help="the students' training seeds")
    parser.add_argument("--data", type=Path, default=Path("data/students"), help="demonstrations go to DATA/<teacher>[_front]")
    parser.add_argument("--out", type=Path, default=Path("runs/students"), help="students go to OUT/<teacher>[_front]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--written", action="store_true", help="read the evaluations as an earlier call left them")
    parser.add_argument("--note", default=None, help="what a reader must know, such as how each teacher was trained")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds, "--seeds")
    recipe = RECIPES[args.view]
    commands, rows = [], []
    for teacher in args.teachers:
        name = teacher_name(teacher) + recipe.folder_suffix
        folder = args.out / name
        for step in commands_for(teacher, recipe, args.data / name, folder, seeds, args.workers, args.stage):
            if not args.written:
                subprocess.run(step, check=True)
            commands.append(as_recorded(step))
        driven = collect_rows([out for _, out in eval_groups(folder, recipe, seeds, args.stage)])
        runs = student_runs(folder, recipe, seeds)
        for stage, key in (("behaviour cloning", "bc"), (recipe.second_stage, "second")):
            rows.append([f"`{teacher}`", stage, *(laps_cell(driven, runs[key][0], preset, seeds) for preset in PRESETS)])
    own = recorded_arguments(sys.argv[1:] if argv is None else argv)
    commands.append(shlex.join(["python", "-m", "bench.teacher_students", *own]))
    configs = [recipe.config, *([recipe.fine_tune] if recipe.fine_tune else [])]
    table = {
        "name": f"{recipe.title} of each teacher{'' if args.stage == 'protocol' else ' (development)'}, "
                f"training seeds {format_seeds(seeds)}: {', '.join(args.teachers)}",
        "caption": f"{recipe.description}; laps per training seed on tracks {STAGE_TRACKS[args.stage]}.",
        "columns": ["teacher", "student", *PRESETS],
        "rows": rows,
        "provenance": current_provenance(commands, configs, seeds, note=args.note),
    }
    path = put_table("ppo-expert", table, REPO)
    render(Layout.of(REPO))
    print(f"→ {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
