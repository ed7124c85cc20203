"""The safety protocol over training seeds, into ``results/safety-protocol.json``.

    python -m bench.safety_protocol runs/a-s0 runs/a-s1 runs/a-s2 --seeds 0,1,2 --config configs/demo.json

Runs ``nsacdrive protocol RUN --out OUT/sS --resume`` for each run (one per training seed; the
folders resume, so an interrupted study picks up where it stopped), then writes the study file
with its provenance (every command as run, commit, machine, versions, the config's sha256, the
seeds) and renders the docs (``python -m bench.results render``). Extra arguments after ``--``
go to every ``nsacdrive protocol`` call.
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

from bench.common import NSACDRIVE_SCRIPT, as_recorded
from bench.results import REPO, Layout, current_provenance, recorded_arguments, render, write_results

WINDOWS = ("1", "3")


def _per_seed(values: list[Any], digits: int = 2) -> str:
    """``a / b / c`` over the seeds ("–" for a missing figure)."""
    return " / ".join("–" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in values)


def _spread(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{np.mean(present):.2f} ± {np.std(present):.2f}" if present else "–"


def pooled(windows: list[dict[str, Any]]) -> dict[str, float | None]:
    """F3, recall, FPR and the shifted windows' alarm rate of counts summed over families."""
    tp, fp, fn, tn = (sum(w[k] for w in windows) for k in ("tp", "fp", "fn", "tn"))
    fp_shifted, tn_shifted = sum(w["fp_shifted"] for w in windows), sum(w["tn_shifted"] for w in windows)
    denominator = tp + 0.1 * fp + 0.9 * fn
    return {"f3": tp / denominator if denominator else None, "recall": tp / (tp + fn) if tp + fn else None,
            "fpr": fp / (fp + tn) if fp + tn else None,
            "fpr_shifted": fp_shifted / (fp_shifted + tn_shifted) if fp_shifted + tn_shifted else None}


def family_table(name: str, caption: str, results: list[dict[str, Any]], folds: list[dict[str, dict[str, Any]]],
                 families: list[str], test: set[str]) -> dict[str, Any]:
    """One row per family (the selected monitor of each seed's fold and its figures, per seed), then
    the counts pooled over the families, per seed and as mean ± std."""
    rows = []
    per_seed_windows: list[dict[str, list[dict[str, Any]]]] = [{w: [] for w in WINDOWS} for _ in results]
    for family in families:
        cells: dict[str, list[Any]] = {k: [] for k in ("monitor", "failures", *WINDOWS, "fpr", "shifted")}
        for seed_index, fold_of in enumerate(folds):
            fold = fold_of[family]
            judged = fold["families"][family]
            windows = judged["scores"][fold["selected"]]["windows"]
            cells["monitor"].append(fold["selected"])
            cells["failures"].append(judged["failures"])
            for w in WINDOWS:
                cells[w].append(windows[w]["f3"] if judged["failures"] else None)
                per_seed_windows[seed_index][w].append(windows[w])
            cells["fpr"].append(windows["1"]["fpr"])
            cells["shifted"].append(windows["1"]["fpr_shifted"])
        rows.append([family, "test" if family in test else "development", " / ".join(cells["monitor"]),
                     _per_seed(cells["failures"]), *(_per_seed(cells[w]) for w in WINDOWS), _per_seed(cells["fpr"]),
                     _per_seed(cells["shifted"])])
    summary = [{w: pooled(seed[w]) for w in WINDOWS} for seed in per_seed_windows]
    for label, cell in (("pooled, per seed", _per_seed), ("pooled, mean ± std", _spread)):
        rows.append([f"**{label}**", "", "", "", *(cell([s[w]["f3"] for s in summary]) for w in WINDOWS),
                     cell([s["1"]["fpr"] for s in summary]), cell([s["1"]["fpr_shifted"] for s in summary])])
    return {"name": name, "caption": caption,
            "columns": ["family", "set", "selected monitor per seed", "failures per seed", "F3 at 1 s", "F3 at 3 s",
                        "FPR (1 s, clean laps)", "alarms on shifted windows (1 s)"], "rows": rows}


def detail_table(results: list[dict[str, Any]], families: list[str], seeds: list[int]) -> dict[str, Any]:
    """Leave-one-family-out, the selected monitor per family: precision, recall and lead at each window,
    frame and curvature-stratified AUROC (cells per seed)."""
    windows = [str(w) for w in results[0]["config"]["monitor"]["windows_s"]]
    rows = []
    for family in families:
        judged = []
        for result in results:
            fold = result["leave_one_family_out"][family]
            judged.append(fold["families"][family]["scores"][fold["selected"]])
        cells = [family]
        for w in windows:
            cells += [_per_seed([j["windows"][w]["precision"] for j in judged]), _per_seed([j["windows"][w]["recall"] for j in judged]),
                      _per_seed([j["windows"][w]["median_lead_s"] for j in judged], 1)]
        rows.append([*cells, _per_seed([j["auroc"] for j in judged]), _per_seed([j["stratified_auroc"] for j in judged])])
    columns = ["family", *(f"{w} s: {m}" for w in windows for m in ("precision", "recall", "lead s")), "frame AUROC",
               "curvature-stratified AUROC"]
    return {"name": "Leave one family out: precision, recall, lead and AUROC",
            "caption": (f"Training seeds {', '.join(map(str, seeds))} (cells per seed): the monitor selected without each "
                        "family, judged on it; the lead is the median time from the first alarm to the failure's onset."),
            "columns": columns, "rows": rows}


def false_alarm_table(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per score: the conformal threshold's false-alarm rate on clean laps of the two track sets it was not fitted on."""
    monitor = results[0]["config"]["monitor"]
    rows = []
    for score in results[0]["false_alarms"]:
        entries = [r["false_alarms"].get(score) for r in results]
        rates = {label: [e[label]["fpr"] if e else None for e in entries] for label in ("test tracks", "check tracks")}
        worst = max((v for values in rates.values() for v in values if v is not None), default=None)
        rows.append([score, _per_seed(rates["test tracks"], 3), _per_seed(rates["check tracks"], 3),
                     "–" if worst is None else "yes" if worst <= monitor["false_alarm_rate"] else "no"])
    return {"name": "False alarms with a guarantee",
            "caption": (f"Conformal window thresholds (target rate {monitor['false_alarm_rate']}, confidence "
                        f"{monitor['confidence']}) fitted on clean laps of the fitting tracks; the share of clean 1 s "
                        "windows that alarm on the test tracks and on the check tracks, per seed."),
            "columns": ["score", "test tracks", "check tracks", "at or below the target on both, every seed"], "rows": rows}


def fallback_tables(results: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """Per fallback: per test family (cells per seed) failures without → with it, the share prevented and the
    episodes that ended safely; then clean laps: steps under the fallback, laps, lap time against unguarded laps."""
    tables = []
    for fallback in results[0].get("fallbacks", {}):
        judged = [r["fallbacks"][fallback] for r in results]
        rows = []
        for family in judged[0]["families"]:
            cells = [j["families"][family] for j in judged]
            rows.append([family, " / ".join(f"{c['failures_without']} → {c['failures_with']}" for c in cells),
                         _per_seed([c["prevented"] for c in cells]), _per_seed([c["ended_safely"] for c in cells]),
                         _per_seed([c["safe_stops"] for c in cells])])
        before = [sum(c["failures_without"] for c in j["families"].values()) for j in judged]
        after = [sum(c["failures_with"] for c in j["families"].values()) for j in judged]
        prevented = [1 - a / b if b else None for a, b in zip(after, before)]
        episodes = [sum(c["episodes"] for c in j["families"].values()) for j in judged]
        safely = [sum((c["ended_safely"] or 0.0) * c["episodes"] for c in j["families"].values()) / n if n else None
                  for j, n in zip(judged, episodes)]
        rows.append(["**all test families**", " / ".join(f"{b} → {a}" for b, a in zip(before, after)),
                     f"{_per_seed(prevented)} ({_spread(prevented)})", f"{_per_seed(safely)} ({_spread(safely)})", ""])
        nominal = [j["nominal"] for j in judged]
        rows.append(["**clean laps**", "", f"under the fallback: {_per_seed([n['fallback_fraction'] for n in nominal], 3)}",
                     f"laps: {_per_seed([n['laps'] for n in nominal])} of {_per_seed([n['episodes'] for n in nominal])}",
                     f"lap time ×{_per_seed([n['lap_time_ratio'] for n in nominal], 3)}"])
        holds = [r["split"].get("hand_back") for r in results]
        if fallback != "stop" and all(holds):  # stop never hands back
            rows.append(["**hand-back hold**", "", f"{_per_seed([h['hold_s'] for h in holds])} s",
                         "chosen on the development data", ""])
        if "cascade_compute" in judged[0]:
            rows.append(["**cascade compute**", "", "", f"at most {_per_seed([j['cascade_compute'] for j in judged], 3)} of running it every step", ""])
        label = " (privileged: an upper bound no real car has)" if fallback == "expert" else ""
        tables.append({"name": f"Fallback {fallback}{label}",
                       "caption": (f"Training seeds {', '.join(map(str, seeds))} (cells per seed). The test tracks under each "
                                   "test family, driven again with the fallback acting on the monitor selected on the "
                                   "development families; failures without → with it on the same tracks and conditions. An "
                                   "episode ended safely with a lap or a safe stop and no failure."),
                       "columns": ["family", "failures", "prevented", "ended safely", "safe stops"], "rows": rows})
    return tables


def nominal_table(folders: list[Path], seeds: list[int]) -> dict[str, Any]:
    """Per seed: how each controller drove the clean laps of the test tracks, unguarded (read from the
    protocol folder's evaluation): a controller that fails without any shift fails under every family too."""
    rows = []
    for folder, seed in zip(folders, seeds):
        aggregates = json.loads((folder / "test-corrupted" / "aggregates.json").read_text())["aggregates"]
        clean = next(r for r in aggregates if r["corruption"] == "none" and r["colour_preset"] == "default")
        rows.append([str(seed), f"{clean['laps']} of {clean['episodes']}", clean["off_road_events"], f"{clean['score_mean']:.1f}"])
    return {"name": "Clean laps of the test tracks",
            "caption": "Each training seed's controller on the test tracks without any shift and without a monitor.",
            "columns": ["training seed", "laps", "off-road events", "mean score"], "rows": rows}


def study_tables(results: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    config = results[0]["config"]
    families, test = list(config["development"]) + list(config["test"]), set(config["test"])
    seeds_text = ", ".join(map(str, seeds))
    lofo = family_table("Leave one family out",
                        f"Training seeds {seeds_text} (cells per seed). For each family, the failure predictor, the "
                        "thresholds and the monitor's selection were fitted without it, then judged on the test tracks "
                        "under it; F3 is empty where a seed's controller did not fail under the family.",
                        results, [r["leave_one_family_out"] for r in results], families, test)
    split = family_table("Development and test families",
                         f"Training seeds {seeds_text}. Everything fitted on the development families, judged on each "
                         "test family.", results, [{f: r["split"] for f in config["test"]} for r in results],
                         list(config["test"]), test)
    return [lofo, detail_table(results, families, seeds), split, false_alarm_table(results), *fallback_tables(results, seeds)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="one run folder per training seed")
    parser.add_argument("--seeds", required=True, help="the runs' training seeds, comma-separated, in the same order")
    parser.add_argument("--config", action="append", default=[], help="the recipe's config file(s), for the stale check")
    parser.add_argument("--out", type=Path, default=Path("runs/protocol"), help="one protocol folder per seed under it")
    parser.add_argument("--study", default="safety-protocol")
    parser.add_argument("--recipe", default="demo recipe", help="what the runs are, for the study's title")
    parser.add_argument("--made-with", action="append", default=[],
                        help="a command that made the runs (training, DAgger, calibration), recorded first in the provenance")
    parser.add_argument("--written", action="store_true",
                        help="read the protocol folders as an earlier call left them, without running the protocol again")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(seeds) != len(args.runs):
        parser.error(f"--seeds: {len(seeds)} seeds for {len(args.runs)} runs")
    commands, results = list(args.made_with), []
    for run, seed in zip(args.runs, seeds):
        command = [NSACDRIVE_SCRIPT, "protocol", str(run), "--out", str(args.out / f"s{seed}"), "--resume", *extra]
        if not args.written:
            subprocess.run(command, check=True)
        commands.append(as_recorded(command))
        results.append(json.loads((args.out / f"s{seed}" / "protocol.json").read_text()))
    own = recorded_arguments(argv, options=("--made-with",))
    commands.append(shlex.join(["python", "-m", "bench.safety_protocol", *own,
                                *(["--", *extra] if extra else [])]))
    provenance = current_provenance(commands, args.config, seeds)
    tables = [nominal_table([args.out / f"s{seed}" for seed in seeds], seeds), *study_tables(results, seeds)]
    path = write_results(args.study, f"The safety protocol, {args.recipe}: monitors on shift families nobody tuned them to",
                         tables, provenance)
    render(Layout.of(REPO))
    print(f"→ {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
