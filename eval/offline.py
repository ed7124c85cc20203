"""Offline evaluation: uncertainty metrics of trained controllers on held-out recorded tracks.

For every run: the test (or validation) track seeds of its own training config, clean
episodes (colour preset ``default``) and, when ``perturbed_preset`` is given, the episodes of
the same seeds recorded under that preset (the expert drives on privileged state, so the
labels are the same laps, recoloured). Predictions use each model's own number of draws.
Per action and model: MSE, NLL, CRPS, MACE/RMSCE, sharpness, AUSE, Spearman
(:func:`nsacdrive.controllers.metrics.regression_report`), and the OOD AUROC of the predictive std
between clean and perturbed frames.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.common.seeds import parse_seeds
from nsacdrive.common.versions import write_versions
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.metrics import ood_auroc, regression_report
from nsacdrive.controllers.run import load_run, read_run_config
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.data_collection.dataset import SequenceDataset
from nsacdrive.envs.corruptions import CorruptionSpec
from nsacdrive.eval.modes import OFFLINE_SPLITS

METRICS = ("mse", "nll", "crps", "mace", "rmsce", "sharpness", "ause", "spearman")


@dataclass
class Predictions:
    target: np.ndarray  # [N, 3]
    mean: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.aleatoric + self.epistemic)


def evenly_spaced(dataset: torch.utils.data.Dataset, max_samples: int | None) -> torch.utils.data.Dataset:
    """At most ``max_samples`` evenly spaced items of ``dataset`` (all of it when None or smaller)."""
    if max_samples is None or len(dataset) <= max_samples:  # type: ignore[arg-type]
        return dataset
    keep = np.linspace(0, len(dataset) - 1, max_samples).astype(int)  # type: ignore[arg-type]
    return torch.utils.data.Subset(dataset, keep.tolist())


@torch.no_grad()
def predict_split(model: torch.nn.Module, dataset: SequenceDataset, samples: int, batch_size: int = 64, seed: int = 0) -> Predictions:
    torch.manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"target": [], "mean": [], "aleatoric": [], "epistemic": []}
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        prediction = model.predict(batch["frames"], batch["timestamps"], samples=samples, speed=batch["speed"])
        parts["target"].append(batch["action"].numpy())
        parts["mean"].append(prediction.mean.numpy())
        parts["aleatoric"].append(prediction.aleatoric.numpy())
        parts["epistemic"].append(prediction.epistemic.numpy())
    return Predictions(**{k: np.concatenate(v).astype(np.float64) for k, v in parts.items()})


def evaluate_run(run_dir: Path, data: Path, split: str = "test", perturbed_preset: str | None = None,
                 max_samples: int | None = None,
                 loaded: tuple[torch.nn.Module, TrainConfig] | None = None, raw: bool = False,
                 corruptions: Sequence[CorruptionSpec] = ()) -> dict[str, Any]:
    """Metrics of one run on its own held-out split; ``max_samples`` subsamples evenly for speed.

    ``loaded``: the run's controller and config from :func:`load_run` when the caller holds them
    already (the run is then not loaded again). The predictions are recalibrated by the run's
    ``calibration.json`` when it has one, unless ``raw`` (the result's ``recalibration`` says which).
    ``corruptions``: also each of these on the clean episodes, one condition per ``FAMILY-SEVERITY``;
    ``ood_auroc_conditions`` holds the AUROC of the predictive std, clean against every other condition."""
    if split not in OFFLINE_SPLITS:
        raise ValueError(f"split: expected one of {', '.join(OFFLINE_SPLITS)}, got {split!r}")
    model, config = loaded if loaded is not None else load_run(run_dir, raw=raw)
    seeds = parse_seeds(config.test_seeds if split == "test" else config.val_seeds, f"{split} seeds")
    kw = dict(sequence_length=config.sequence_length, frame_stride=config.frame_stride, observation=config.model.observation)
    conditions: dict[str, tuple[str, CorruptionSpec | None]] = {"clean": ("default", None)}
    if perturbed_preset:
        conditions[perturbed_preset] = (perturbed_preset, None)
    conditions.update({spec.name: ("default", spec) for spec in corruptions})
    calibration = getattr(model, "calibration", None)
    out: dict[str, Any] = {"run": str(run_dir), "model": config.model.model, "split": split, "seeds": seeds, "conditions": {},
                           "recalibration": calibration.method if calibration is not None else "none"}
    predictions = {}
    for name, (preset, corruption) in conditions.items():
        dataset = SequenceDataset(data, seeds, colour_presets=[preset], corruption=corruption, **kw)
        if len(dataset) == 0:
            raise ValueError(f"{data}: no {split} episodes (seeds {seeds}) with colour preset {preset!r}; "
                             f"record them with `nsacdrive collect --seeds ... --colour-preset {preset}`")
        pred = predict_split(model, evenly_spaced(dataset, max_samples), config.model.predict_samples)
        predictions[name] = pred
        report = regression_report(pred.target, pred.mean, pred.aleatoric, pred.epistemic, action_names=ACTION_NAMES)
        out["conditions"][name] = {"samples": len(pred.target), **report}
    clean = predictions["clean"]
    out["ood_auroc_conditions"] = {name: _auroc(clean, shifted) for name, shifted in predictions.items() if name != "clean"}
    if perturbed_preset:
        out["ood_auroc"] = out["ood_auroc_conditions"][perturbed_preset]
    return out


def _auroc(clean: Predictions, shifted: Predictions) -> dict[str, float]:
    """AUROC of the predictive std, clean (negative) against shifted (positive), per action and of the mean std."""
    out = {a: ood_auroc(clean.std[:, i], shifted.std[:, i]) for i, a in enumerate(ACTION_NAMES)}
    out["mean_std"] = ood_auroc(clean.std.mean(1), shifted.std.mean(1))
    return out


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, condition, action) with every metric (and AUROC when available)."""
    rows = []
    for result in results:
        for condition, report in result["conditions"].items():
            for action in ACTION_NAMES:
                metrics = report["per_action"][action]
                row = {"model": result["model"], "run": Path(result["run"]).name, "recalibration": result["recalibration"],
                       "condition": condition, "action": action}
                row.update({m: metrics[m] for m in METRICS})
                row["ood_auroc"] = result.get("ood_auroc_conditions", {}).get(condition, {}).get(action)
                rows.append(row)
    return rows


def _cell(row: dict[str, Any], column: str) -> str:
    value = row[column]
    if value is None:
        return ""
    if not isinstance(value, float):
        return str(value)
    spread = row.get(f"{column}_std")
    return f"{value:.4f} ± {spread:.4f}" if spread is not None else f"{value:.4f}"


def to_markdown(rows: list[dict[str, Any]]) -> str:
    columns = ["model", *(["recalibration"] if "recalibration" in rows[0] else []), "condition", "action", *METRICS, "ood_auroc"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row, c) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_tables(results: list[dict[str, Any]], out_dir: Path, rows: list[dict[str, Any]] | None = None) -> str:
    """offline.md / offline.csv / offline.json in ``out_dir``; returns the markdown."""
    rows = table_rows(results) if rows is None else rows
    markdown = to_markdown(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "offline.md", (markdown + "\n").encode())
    atomic_write_bytes(out_dir / "offline.csv", buffer.getvalue().encode())
    atomic_write_json(out_dir / "offline.json", {"results": results, "calibration_convention": results[0]["conditions"]["clean"]["calibration"]})
    write_versions(out_dir)
    return markdown


def seed_repeats(run_dir: Path, count: int, progress: bool = True) -> list[Path]:
    """``run_dir`` plus ``count − 1`` retrainings with seeds seed+1, … (in run_dir/seed-repeats/, resumable)."""
    import dataclasses

    from nsacdrive.controllers.training import Trainer

    config = read_run_config(run_dir)
    runs = [run_dir]
    for k in range(1, count):
        target = run_dir / "seed-repeats" / f"seed{config.seed + k}"
        Trainer(dataclasses.replace(config, seed=config.seed + k), target, progress=progress).fit(resume=True)  # a finished one returns at once
        runs.append(target)
    return runs


def aggregate_seeds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with mean ± std over seed repeats of the same model (``<metric>_std`` columns added)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in table_rows(results):
        groups.setdefault((row["model"], row["condition"], row["action"]), []).append(row)
    aggregated = []
    for (model, condition, action), rows in groups.items():
        entry: dict[str, Any] = {"model": model, "run": f"{len(rows)} seeds", "condition": condition, "action": action}
        for metric in (*METRICS, "ood_auroc"):
            values = [r[metric] for r in rows if r[metric] is not None]
            entry[metric] = float(np.mean(values)) if values else None
            entry[f"{metric}_std"] = float(np.std(values)) if values else None
        aggregated.append(entry)
    return aggregated
