"""Which recipe keeps driving when the picture changes: recipes × models × training seeds, chosen on
development families and judged on test families.

    python -m bench.robust_study configs/quality-robust-erase.json … --stage development --seeds 0
    python -m bench.robust_study configs/quality.json configs/quality-robust.json --stage development
    python -m bench.robust_study configs/quality-robust.json --models nsac,levy,gmle,ensemble --stage test

Every recipe is trained for every model and seed (``nsacdrive sweep``, into ``OUT/<recipe>/``)
and driven with no pedal caution and no fallback. Both stages use the safety protocol's split of
shift families (:mod:`nsacdrive.eval.protocol_config`):

* ``development``: held-out tracks 1010–1020, clean and under every development family at
  severities 3 and 5. Recipes are chosen here. These tracks are not the test tracks, and the
  families are not the test families.
* ``test``: tracks 42 and 1000–1009, clean and under ``shift-3``, ``color-v0``, ``random`` and
  every test family at severities 3 and 5. These are the robustness targets' conditions.

Every step resumes. Each call adds one table to ``results/robust-<stage>.json``, with its
provenance: laps per condition for each recipe and model, per seed, pooled over the families (a
call with other recipes or seeds, such as a one-seed screen of candidates, adds its own table).
Then it renders the docs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import NSACDRIVE_SCRIPT, as_recorded
from bench.results import REPO, Layout, current_provenance, put_table, recorded_arguments, render
from nsacdrive.common.seeds import format_seeds, parse_seeds
from nsacdrive.eval.protocol_config import ProtocolConfig

CLEAN = "clean"
STAGES = {
    "development": {"tracks": "1010-1020", "presets": (), "scored": ()},
    "test": {"tracks": "42,1000-1009", "presets": ("shift-3", "color-v0", "random"), "scored": (CLEAN, "shift-3", "color-v0")},
}


def stage_conditions(stage: str, protocol: ProtocolConfig) -> tuple[list[str], list[str]]:
    """The corruptions (``FAMILY-SEVERITY``) and colour presets a stage drives, besides clean laps."""
    families = protocol.development if stage == "development" else protocol.test
    corruptions = [c for c in protocol.corruptions() if c.rpartition("-")[0] in families]
    presets = [*STAGES[stage]["presets"], *(f for f in families if f in protocol.colour_presets())]
    return corruptions, list(dict.fromkeys(presets))


def condition_of(row: dict[str, Any]) -> str:
    """An aggregate row's condition: its corruption, its colour preset, or :data:`CLEAN`."""
    if row["corruption"] != "none":
        return row["corruption"]
    return CLEAN if row["colour_preset"] == "default" else row["colour_preset"]


Laps = dict[tuple[str, str], tuple[int, int, float]]


def read_laps(eval_dirs: Iterable[Path]) -> Laps:
    """(run, condition) → (laps, episodes, mean score) over the evaluations' ``aggregates.json``."""
    out: Laps = {}
    for folder in eval_dirs:
        for row in json.loads((folder / "aggregates.json").read_text())["aggregates"]:
            out[(row["run"], condition_of(row))] = (int(row["laps"]), int(row["episodes"]), float(row["score_mean"]))
    return out


def laps_table(stage: str, laps: dict[str, Laps], models: list[str], seeds: list[int], conditions: list[str]) -> dict[str, Any]:
    """One row per condition and a pooled row per seed; one column per recipe × model, cells the laps
    per seed (``a / b / c of N``), and the mean score per seed where the stage's targets name one."""
    columns = [(recipe, model) for recipe in laps for model in models]

    def per_seed(recipe: str, model: str, condition: str) -> list[tuple[int, int, float] | None]:
        return [laps[recipe].get((f"{model}-s{seed}", condition)) for seed in seeds]

    def cell(recipe: str, model: str, condition: str) -> str:
        found = per_seed(recipe, model, condition)
        episodes = next((f[1] for f in found if f is not None), None)
        text = " / ".join("–" if f is None else str(f[0]) for f in found) + (f" of {episodes}" if episodes else "")
        if condition in STAGES[stage]["scored"]:
            text += ", score " + " / ".join("–" if f is None else f"{f[2]:.0f}" for f in found)
        return text

    rows = [[condition, *(cell(recipe, model, condition) for recipe, model in columns)] for condition in conditions]
    pooled = ["**shifted, pooled: laps per seed (mean ± std)**"]
    for recipe, model in columns:
        shares, shifted = [], [per_seed(recipe, model, c) for c in conditions if c != CLEAN]
        for index in range(len(seeds)):
            found = [row[index] for row in shifted if row[index] is not None]
            shares.append(sum(f[0] for f in found) / sum(f[1] for f in found) if found else None)
        present = [s for s in shares if s is not None]
        spread = f" ({100 * np.mean(present):.0f} ± {100 * np.std(present):.0f} %)" if present else ""
        pooled.append(" / ".join("–" if s is None else f"{100 * s:.0f} %" for s in shares) + spread)
    rows.append(pooled)
    tracks, seed_list = STAGES[stage]["tracks"], ", ".join(map(str, seeds))
    recipes = ", ".join(dict.fromkeys(Path(recipe).stem for recipe in laps))
    return {"name": f"Laps, {stage} stage, training seeds {seed_list}: {recipes} ({', '.join(models)})",
            "caption": (f"Tracks {tracks}, one episode each per condition, no pedal caution and no fallback; laps per "
                        f"training seed {seed_list}. Recipes are chosen on the development stage alone."),
            "columns": ["condition", *(f"{Path(recipe).stem}, {model}" for recipe, model in columns)], "rows": rows}


def eval_folder(folder: Path, stage: str, model: str, seeds: list[int], part: str) -> Path:
    """Where a recipe's evaluation of one stage, model, set of training seeds and part lives: each
    model and set of seeds its own folder, so a one-seed screen and the three-seed comparison never
    mix, a model added later drives only its own episodes, and ``0,1,2`` and ``0-2`` share one."""
    return folder / f"eval-{stage}-{model}-seeds-{format_seeds(seeds).replace(',', '_')}-{part}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="+", type=Path, help="recipe config files (configs/*.json)")
    parser.add_argument("--stage", choices=sorted(STAGES), required=True)
    parser.add_argument("--models", default="nsac")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--data", default="data/quality", help="the recipes' dataset (collected as bench/closed_loop_quality.sh does)")
    parser.add_argument("--out", type=Path, default=Path("runs/robust"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--written", action="store_true", help="read the evaluations as an earlier call left them")
    args = parser.parse_args(argv)
    seeds, models = parse_seeds(args.seeds, "--seeds"), args.models.split(",")
    protocol = ProtocolConfig()
    corruptions, presets = stage_conditions(args.stage, protocol)
    commands, laps = [], {}
    evals = {"corrupted": ["--corruption", ",".join(["none", *corruptions])]}
    if presets:
        evals["colours"] = ["--colour-preset", ",".join(presets)]
    for recipe in args.recipes:
        folder = args.out / recipe.stem
        outs = {(model, part): eval_folder(folder, args.stage, model, seeds, part) for model in models for part in evals}
        steps = [[NSACDRIVE_SCRIPT, "sweep", "--config", str(recipe), "--data", args.data, "--seeds", args.seeds, "--models", args.models,
                  "--workers", str(args.workers), "--out", str(folder)]]
        for (model, part), out in outs.items():
            runs = [str(folder / f"{model}-s{seed}") for seed in seeds]
            steps.append([NSACDRIVE_SCRIPT, "eval", *runs, "--seeds", STAGES[args.stage]["tracks"], *evals[part], "--workers", str(args.workers),
                          "--out", str(out), "--resume"])
        for step in steps:
            if not args.written:
                subprocess.run(step, check=True)
            commands.append(as_recorded(step))
        laps[str(recipe)] = read_laps(outs.values())
    own = recorded_arguments(sys.argv[1:] if argv is None else argv)
    commands.append(shlex.join(["python", "-m", "bench.robust_study", *own]))
    table = laps_table(args.stage, laps, models, seeds, [CLEAN, *presets, *corruptions])
    provenance = current_provenance(commands, [str(r) for r in args.recipes], seeds)
    path = put_table(f"robust-{args.stage}", {**table, "provenance": provenance}, REPO,
                     title=f"Robust recipes, {args.stage} stage: laps under shifts")
    render(Layout.of(REPO))
    print(f"→ {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
