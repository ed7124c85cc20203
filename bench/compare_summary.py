"""The 8-model comparison in a few rows: clean test tracks and the corruption suite, per model,
mean ± std over its training seeds, from ``evaluate-offline``'s offline.json.

    python -m bench.compare_summary runs/cmp-offline/offline.json [MORE.json ...] [--action steer]

A corruption is *harmful* for a run when it at least doubles that run's clean MSE of the action;
error detection (σ against |error| above the clean 90th percentile) and Spearman(σ, |error|) are
then averaged over its harmful conditions, and the OOD AUROCs over its harmful conditions at
severity ≥ 3. Every per-run figure is computed first, then mean ± std (ddof 0) over the seeds.
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
from nsacdrive.envs.corruptions import parse_corruptions

#: a corruption that at least multiplies the clean MSE by this is harmful
HARM_RATIO = 2.0
#: the OOD targets are set at this severity and above
OOD_SEVERITY = 3


@dataclass(frozen=True)
class Column:
    """One summary column: its header and how a run's result gives it (None: not defined for it)."""

    header: str
    value: Callable[[dict[str, Any], str], float | None]
    digits: int = 4


def severity(condition: str) -> int | None:
    """The severity of a ``FAMILY-SEVERITY`` corruption, None for clean and colour presets."""
    try:
        (spec,) = parse_corruptions(condition)
    except ValueError:
        return None
    return spec.severity


def corruptions(result: dict[str, Any]) -> list[str]:
    return [c for c in result["conditions"] if severity(c) is not None]


def metric(result: dict[str, Any], condition: str, action: str, name: str, block: str = "per_action") -> float | None:
    value = result["conditions"][condition].get(block, {}).get(action, {}).get(name)
    return None if value is None else float(value)


def harmful(result: dict[str, Any], action: str) -> list[str]:
    clean = metric(result, "clean", action, "mse")
    return [c for c in corruptions(result) if (metric(result, c, action, "mse") or 0.0) >= HARM_RATIO * clean]


def defined(value: float | None) -> bool:
    """Not missing and not NaN (a rank statistic of a constant σ, e.g. NAC's homoscedastic one)."""
    return value is not None and not np.isnan(value)


def mean_over(values: list[float | None]) -> float | None:
    kept = [v for v in values if defined(v)]
    return float(np.mean(kept)) if kept else None


def ood(result: dict[str, Any], condition: str, action: str, component: str) -> float | None:
    components = result.get("ood_auroc_conditions", {}).get(condition, {}).get("components", {})
    value = components.get(component)
    return value.get(action) if isinstance(value, dict) else value


def harmful_ood(component: str) -> Callable[[dict[str, Any], str], float | None]:
    return lambda r, a: mean_over([ood(r, c, a, component) for c in harmful(r, a) if severity(c) >= OOD_SEVERITY])


COLUMNS = (
    Column("MSE", lambda r, a: metric(r, "clean", a, "mse")),
    Column("NLL cal", lambda r, a: metric(r, "clean", a, "nll", "per_action_calibrated")),
    Column("CRPS", lambda r, a: metric(r, "clean", a, "crps")),
    Column("MACE raw", lambda r, a: metric(r, "clean", a, "mace")),
    Column("MACE cal", lambda r, a: metric(r, "clean", a, "mace", "per_action_calibrated")),
    Column("90 % cover (conformal)", lambda r, a: metric(r, "clean", a, "coverage_90", "per_action_calibrated"), 3),
    Column("MACE isotonic", lambda r, a: metric(r, "clean", a, "mace_isotonic", "per_action_calibrated")),
    Column("AUSE", lambda r, a: metric(r, "clean", a, "ause")),
    Column("CRPS suite", lambda r, a: mean_over([metric(r, c, a, "crps") for c in corruptions(r)])),
    Column("harmful", lambda r, a: float(len(harmful(r, a))), 1),
    Column("error AUROC harmful", lambda r, a: mean_over([metric(r, c, a, "error_auroc") for c in harmful(r, a)]), 2),
    Column("worst error AUROC harmful", lambda r, a: min([metric(r, c, a, "error_auroc") for c in harmful(r, a)], default=None), 2),
    Column("Spearman harmful", lambda r, a: mean_over([metric(r, c, a, "spearman") for c in harmful(r, a)]), 2),
    Column("OOD σ", harmful_ood("total"), 2),
    Column("OOD epistemic", harmful_ood("epistemic"), 2),
    Column("OOD density", harmful_ood("density"), 2),
)


def interval(results: list[dict[str, Any]], action: str) -> str:
    """The seeds' mean CRPS bootstrap bounds on clean tracks."""
    lows = [metric(r, "clean", action, "crps_lo") for r in results]
    highs = [metric(r, "clean", action, "crps_hi") for r in results]
    if any(v is None for v in lows + highs):
        return ""
    return f"[{np.mean(lows):.4f}, {np.mean(highs):.4f}]"


def summarise(results: list[dict[str, Any]], action: str = "steer") -> list[dict[str, Any]]:
    """One row per model (in first-seen order): every column's per-seed values, mean and std."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_model.setdefault(result["model"], []).append(result)
    rows = []
    for model, runs in by_model.items():
        row: dict[str, Any] = {"model": model, "seeds": len(runs), "interval": interval(runs, action)}
        for column in COLUMNS:
            values = [v for v in (column.value(r, action) for r in runs) if defined(v)]
            row[column.header] = (float(np.mean(values)), float(np.std(values)), values) if values else None
        rows.append(row)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """Mean ± std per cell; the clean CRPS's episode-bootstrap interval follows the CRPS column."""
    headers = ["model", "seeds"]
    for column in COLUMNS:
        headers += [column.header, "CRPS 95 % interval"] if column.header == "CRPS" else [column.header]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row["model"], str(row["seeds"])]
        for column in COLUMNS:
            value = row[column.header]
            # fewer seeds than the row's: e.g. no harmful condition for some of them
            cells.append("" if value is None else spread_cell(value[0], value[1], len(value[2]), row["seeds"], column.digits))
            if column.header == "CRPS":
                cells.append(row["interval"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("offline_json", type=Path, nargs="+", help="offline.json of `nsacdrive evaluate-offline` (several: their results pooled)")
    parser.add_argument("--action", default="steer", choices=("steer", "gas", "brake"))
    args = parser.parse_args()
    results = [result for path in args.offline_json for result in json.loads(path.read_text())["results"]]
    print(to_markdown(summarise(results, args.action)))


if __name__ == "__main__":
    main()
