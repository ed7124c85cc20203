"""Monitors of several models side by side: ``nsacdrive monitor`` results, mean ± std over seeds.

    python -m bench.monitor_summary nsac=mon/nsac-s0,mon/nsac-s1,mon/nsac-s2 ensemble=mon/ens-s0,... [--window 1]

Each ``LABEL=DIR,...`` names one model and its ``monitor`` folders, one per training seed. Every
figure is read per seed first (frame AUROC/AUPRC, the curvature-stratified AUROC, F3, FPR, recall,
precision at ``--window`` seconds, the median lead inside the longest window, the share of
alarming windows on shifted episodes that have not failed yet), then mean ± std (ddof 0) over the
seeds. Prints one table per model and one side-by-side table of the scores every model has
(NSAC's uncertainty against MC-Dropout, ensemble and no-uncertainty monitors).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import spread_cell
from bench.compare_summary import defined


@dataclass(frozen=True)
class Figure:
    """One per-seed figure of a score's entry in ``monitor.json`` (None: not defined for that seed)."""

    header: str
    value: Callable[[dict[str, Any], str, str], float | None]


def window(entry: dict[str, Any], seconds: str, name: str) -> float | None:
    value = entry["windows"].get(seconds, {}).get(name)
    return None if value is None else float(value)


FIGURES = (
    Figure("frame AUROC", lambda e, w, last: e.get("auroc")),
    Figure("AUPRC", lambda e, w, last: e.get("auprc")),
    Figure("curvature-stratified AUROC", lambda e, w, last: e.get("stratified_auroc")),
    Figure("F3", lambda e, w, last: window(e, w, "f3")),
    Figure("FPR", lambda e, w, last: window(e, w, "fpr")),
    Figure("recall", lambda e, w, last: window(e, w, "recall")),
    Figure("precision", lambda e, w, last: window(e, w, "precision")),
    Figure("lead s (longest window)", lambda e, w, last: window(e, last, "median_lead_s")),
    Figure("alarms on shifted, not failing", lambda e, w, last: window(e, w, "fpr_shifted")),
)
#: the figures of the side-by-side table
COMPACT = ("F3", "FPR", "frame AUROC", "curvature-stratified AUROC")


def parse_groups(items: list[str]) -> dict[str, list[Path]]:
    """``LABEL=DIR,DIR`` arguments → label → monitor folders; refuses a missing ``monitor.json``."""
    groups: dict[str, list[Path]] = {}
    for item in items:
        label, sep, dirs = item.partition("=")
        if not sep or not label or not dirs:
            raise ValueError(f"expected LABEL=DIR[,DIR...], got {item!r}")
        if label in groups:
            raise ValueError(f"label {label!r} given twice")
        folders = [Path(d) for d in dirs.split(",") if d]
        for folder in folders:
            if not (folder / "monitor.json").is_file():
                raise FileNotFoundError(f"{folder}: no monitor.json (run `nsacdrive monitor ... --out {folder}`)")
        groups[label] = folders
    return groups


def mean_std(values: list[float | None]) -> tuple[float, float, int] | None:
    """Mean, std (ddof 0) and count of the defined values; None when none is."""
    kept = [v for v in values if defined(v)]
    return (float(np.mean(kept)), float(np.std(kept)), len(kept)) if kept else None


def summarise(results: list[dict[str, Any]], seconds: int) -> dict[str, Any]:
    """One model's seeds → failures per seed and, per score every seed has, each figure's mean ± std."""
    last = str(max(results[0]["config"]["windows_s"]))
    names = [n for n in results[0]["scores"] if all(n in r["scores"] for r in results)]
    scores = {}
    for name in names:
        entries = [r["scores"][name] for r in results]
        scores[name] = {"uses_uncertainty": entries[0]["uses_uncertainty"],
                        **{f.header: mean_std([f.value(e, str(seconds), last) for e in entries]) for f in FIGURES}}
    return {"seeds": len(results), "failures": [len(r["failures"]) for r in results], "scores": scores}


def cell(value: tuple[float, float, int] | None, seeds: int) -> str:
    return "–" if value is None else spread_cell(value[0], value[1], value[2], seeds)


def model_table(label: str, summary: dict[str, Any]) -> str:
    headers = ["score", "uses uncertainty", *(f.header for f in FIGURES)]
    lines = [f"**{label}** ({summary['seeds']} seeds; failures per seed: {' / '.join(map(str, summary['failures']))})", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for name, row in summary["scores"].items():
        cells = [name, "yes" if row["uses_uncertainty"] else "no", *(cell(row[f.header], summary["seeds"]) for f in FIGURES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def side_by_side(summaries: dict[str, dict[str, Any]]) -> str:
    """Scores every model has; each cell F3 / FPR / frame AUROC / stratified AUROC (means over seeds)."""
    labels = list(summaries)
    names = [n for n in summaries[labels[0]]["scores"] if all(n in s["scores"] for s in summaries.values())]
    headers = ["score", *(f"{label}: {' / '.join(COMPACT)}" for label in labels)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for name in names:
        cells = [name]
        for label in labels:
            row, seeds = summaries[label]["scores"][name], summaries[label]["seeds"]
            cells.append(" / ".join(cell(row[h], seeds) for h in COMPACT))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="+", metavar="LABEL=DIR,...", help="a model's monitor folders, one per seed")
    parser.add_argument("--window", type=int, default=1, help="reaction window (s) of F3, FPR, recall, precision")
    args = parser.parse_args()
    try:
        groups = parse_groups(args.groups)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    summaries = {label: summarise([json.loads((d / "monitor.json").read_text()) for d in dirs], args.window)
                 for label, dirs in groups.items()}
    for label, summary in summaries.items():
        print(model_table(label, summary) + "\n")
    if len(summaries) > 1:
        print(side_by_side(summaries))


if __name__ == "__main__":
    main()
