"""Offline evaluation: uncertainty metrics of trained controllers on held-out recorded tracks.

For every run: the test (or validation) track seeds of its own training config, clean
episodes (colour preset ``default``) and, when ``perturbed_preset`` is given, the episodes of
the same seeds recorded under that preset (the expert drives on privileged state, so the
labels are the same laps, recoloured). Predictions use each model's own number of draws.
Per action, model and condition: MSE, NLL, CRPS, MACE/RMSCE, sharpness, AUSE, risk–coverage
AURC, Spearman(σ, |err|), 90 % interval coverage
(:func:`nsacdrive.controllers.metrics.regression_report`) and the error-detection AUROC (σ against
|err| above the clean condition's 90th percentile); raw and, for runs with ``calibration.json``,
recalibrated (coverage then of the conformal interval). Against clean: the OOD AUROC of each
uncertainty component — total, aleatoric, epistemic and the feature density when the run has one.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.common.progress import progress_bar
from nsacdrive.common.seeds import parse_seeds
from nsacdrive.common.versions import write_versions
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.calibration import read_calibration
from nsacdrive.controllers.censored import CENSORED_ACTIONS
from nsacdrive.controllers.metrics import (
    censored_scores,
    episode_bootstrap_intervals,
    ood_auroc,
    pit_calibration_curve,
    regression_report,
)
from nsacdrive.controllers.run import load_run, read_run_config
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.data_collection.dataset import SequenceDataset, batch_loader, frame_kind, network_frames
from nsacdrive.envs.corruptions import CorruptionSpec
from nsacdrive.eval.modes import OFFLINE_SPLITS

METRICS = ("mse", "nll", "crps", "mace", "rmsce", "sharpness", "ause", "aurc", "spearman", "coverage_90", "error_auroc")
#: The metrics that recalibration changes (variance scaling keeps every ranking), reported raw and ``_cal``.
CALIBRATED_METRICS = ("nll", "crps", "mace", "coverage_90")
#: Episode resamples behind each ``<metric>_lo`` / ``_hi`` (95 % percentile interval; :func:`episode_bootstrap_intervals`).
BOOTSTRAP_DRAWS = 1000
#: An error is "large" above this quantile of the clean condition's |error| (per action): error_auroc's positives.
ERROR_QUANTILE = 0.9
#: The conformal level whose widths give the calibrated coverage_90.
CONFORMAL_ALPHA = 0.1


@dataclass
class Predictions:
    target: np.ndarray  # [N, 3]
    mean: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray
    density: np.ndarray | None = None  # [N] feature-density score, when the run has one
    signals: dict[str, np.ndarray] | None = None  # head-specific signals [N, A] (Lévy: evidence, disagreement, deviation)
    episode: np.ndarray | None = None  # [N] the episode of each sequence (the episode bootstrap's groups)
    latent_mean: np.ndarray | None = None  # [N, A] a censored-pedal head's latent Gaussian (controllers/censored.py)
    latent_variance: np.ndarray | None = None

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.aleatoric + self.epistemic)

    def scaled(self, variance_scale: np.ndarray) -> Predictions:
        """Both variance parts multiplied by ``variance_scale`` per action (variance scaling)."""
        return replace(self, aleatoric=self.aleatoric * variance_scale, epistemic=self.epistemic * variance_scale)


def evenly_spaced(dataset: torch.utils.data.Dataset, max_samples: int | None) -> torch.utils.data.Dataset:
    """At most ``max_samples`` evenly spaced items of ``dataset`` (all of it when None or smaller)."""
    if max_samples is None or len(dataset) <= max_samples:  # type: ignore[arg-type]
        return dataset
    keep = np.linspace(0, len(dataset) - 1, max_samples).astype(int)  # type: ignore[arg-type]
    return torch.utils.data.Subset(dataset, keep.tolist())


@torch.no_grad()
def predict_split(model: torch.nn.Module, dataset: SequenceDataset, samples: int, batch_size: int = 64, seed: int = 0) -> Predictions:
    torch.manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("target", "mean", "aleatoric", "epistemic", "density", "episode",
                                                                "latent_mean", "latent_variance")}
    signals: dict[str, list[np.ndarray]] = {}
    for batch in batch_loader(dataset, batch_size):
        prediction = model.predict(network_frames(batch["frames"], frame_kind(dataset)), batch["timestamps"], samples=samples, speed=batch["speed"])
        parts["target"].append(batch["action"].numpy())
        parts["episode"].append(batch["episode"].numpy())
        for name in ("mean", "aleatoric", "epistemic", "density", "latent_mean", "latent_variance"):
            if (value := getattr(prediction, name)) is not None:
                parts[name].append(value.numpy())
        for name, value in (prediction.signals or {}).items():
            signals.setdefault(name, []).append(value.numpy())
    joined = {k: np.concatenate(v).astype(np.int64 if k == "episode" else np.float64) if v else None
              for k, v in {**parts, **signals}.items()}
    return Predictions(**{k: joined[k] for k in parts}, signals={k: joined[k] for k in signals} or None)  # type: ignore[arg-type]


def condition_predictions(model: torch.nn.Module, config: TrainConfig, data: Path, seeds: list[int], preset: str = "default",
                          corruption: CorruptionSpec | None = None, max_samples: int | None = None,
                          split: str = "test") -> Predictions:
    """A run's predictions on ``seeds`` recorded under ``preset``, optionally corrupted (ValueError when none are recorded)."""
    dataset = SequenceDataset(data, seeds, colour_presets=[preset], corruption=corruption, sequence_length=config.sequence_length,
                              frame_stride=config.frame_stride, observation=config.model.observation,
                              camera_fov=config.model.camera_fov)
    if len(dataset) == 0:
        raise ValueError(f"{data}: no {split} episodes (seeds {seeds}) with colour preset {preset!r}; "
                         f"record them with `nsacdrive collect --seeds ... --colour-preset {preset}`")
    return predict_split(model, evenly_spaced(dataset, max_samples), config.model.predict_samples)


def large_error_threshold(clean: Predictions) -> np.ndarray:
    """Per action, the |error| above which an error counts as large: the clean condition's ERROR_QUANTILE."""
    return np.quantile(np.abs(clean.target - clean.mean), ERROR_QUANTILE, axis=0)


def evaluate_run(run_dir: Path, data: Path, split: str = "test", perturbed_preset: str | None = None,
                 max_samples: int | None = None,
                 loaded: tuple[torch.nn.Module, TrainConfig] | None = None, raw: bool = False,
                 corruptions: Sequence[CorruptionSpec] = (), progress: bool = False) -> dict[str, Any]:
    """Metrics of one run on its own held-out split; ``max_samples`` subsamples evenly for speed;
    ``progress`` shows the conditions done (a bar, or a line now and then in a log).

    ``loaded``: the run's raw controller and config (``load_run(run_dir, raw=True)``) when the
    caller holds them already. Every condition holds ``per_action`` from the raw predictions and,
    when the run has a ``calibration.json`` and not ``raw``, ``per_action_calibrated`` from the same
    predictions recalibrated (``recalibration`` names the method). ``corruptions``: also each of
    these on the clean episodes, one condition per ``FAMILY-SEVERITY``. ``ood_auroc_conditions``:
    per condition, the AUROC of each uncertainty component against clean (:func:`_ood_aurocs`)."""
    if split not in OFFLINE_SPLITS:
        raise ValueError(f"split: expected one of {', '.join(OFFLINE_SPLITS)}, got {split!r}")
    model, config = loaded if loaded is not None else load_run(run_dir, raw=True)
    if getattr(model, "calibration", None) is not None:
        raise ValueError(f"{run_dir}: evaluate_run needs the raw controller (load_run(..., raw=True)); it applies calibration.json itself")
    calibration = None if raw else read_calibration(run_dir)
    seeds = parse_seeds(config.test_seeds if split == "test" else config.val_seeds, f"{split} seeds")
    conditions: dict[str, tuple[str, CorruptionSpec | None]] = {"clean": ("default", None)}
    if perturbed_preset:
        conditions[perturbed_preset] = (perturbed_preset, None)
    conditions.update({spec.name: ("default", spec) for spec in corruptions})
    density = getattr(model, "density", None)
    out: dict[str, Any] = {"run": str(run_dir), "model": config.model.model, "split": split, "seeds": seeds, "conditions": {},
                           "recalibration": calibration.method if calibration is not None else "none",
                           "density": density is not None, "density_source": None if density is None else density.source}
    predictions = {}
    for name, (preset, corruption) in progress_bar(list(conditions.items()), desc=Path(run_dir).name, unit="condition",
                                                   disable=not progress):
        predictions[name] = condition_predictions(model, config, data, seeds, preset, corruption, max_samples, split)
    error_threshold = large_error_threshold(predictions["clean"])
    for name, pred in predictions.items():
        out["conditions"][name] = {"samples": len(pred.target), **_report(pred, error_threshold)}
        if pred.density is not None:
            out["conditions"][name]["mean_density"] = float(pred.density.mean())
        if calibration is not None:
            recalibrated = _report(pred.scaled(np.asarray(calibration.variance_scale)), error_threshold,
                                   calibration.conformal.get(str(CONFORMAL_ALPHA)))
            if calibration.isotonic is not None:
                _add_isotonic(recalibrated, calibration.recalibrated_pit(pred.target, pred.mean, pred.aleatoric + pred.epistemic))
            out["conditions"][name].update({f"{key}_calibrated": value for key, value in recalibrated.items() if key != "calibration"})
            if calibration.deviation_scale is not None and pred.signals is not None and "deviation" in pred.signals:
                scale = np.maximum(calibration.deviation_std(pred.signals["deviation"]), np.finfo(np.float64).tiny)
                deviation = _report(replace(pred, aleatoric=scale**2, epistemic=np.zeros_like(scale)), error_threshold)
                out["conditions"][name].update({"per_action_deviation": deviation["per_action"], "average_deviation": deviation["average"]})
        if pred.latent_mean is not None:
            out["conditions"][name]["per_action_censored"] = _censored_report(pred)
    clean = predictions["clean"]
    out["ood_auroc_conditions"] = {name: _ood_aurocs(clean, shifted) for name, shifted in predictions.items() if name != "clean"}
    if perturbed_preset:
        out["ood_auroc"] = out["ood_auroc_conditions"][perturbed_preset]
    return out


def _report(pred: Predictions, error_threshold: np.ndarray, conformal_widths: Sequence[float] | None = None) -> dict[str, Any]:
    """:func:`regression_report` plus error_auroc per action; ``conformal_widths`` (q̂ per action, in
    units of σ): coverage_90 is then that of the conformal interval μ ± q̂·σ instead of the Gaussian one."""
    report = regression_report(pred.target, pred.mean, pred.aleatoric, pred.epistemic, action_names=ACTION_NAMES)
    abs_error, std = np.abs(pred.target - pred.mean), pred.std
    intervals = None if pred.episode is None else episode_bootstrap_intervals(pred.target, pred.mean, pred.aleatoric + pred.epistemic,
                                                                                pred.episode, draws=BOOTSTRAP_DRAWS)
    for i, action in enumerate(ACTION_NAMES):
        metrics = report["per_action"][action]
        metrics["error_auroc"] = _split_auroc(std[:, i], abs_error[:, i] > error_threshold[i])
        metrics["mean_aleatoric"], metrics["mean_epistemic"] = float(pred.aleatoric[:, i].mean()), float(pred.epistemic[:, i].mean())
        if intervals is not None:
            metrics.update({f"{name}_{bound}": float(bounds[k, i]) for name, bounds in intervals.items() for k, bound in enumerate(("lo", "hi"))})
        if conformal_widths is not None:
            metrics["coverage_90"] = float(np.mean(abs_error[:, i] <= conformal_widths[i] * std[:, i]))
    for metric in ("error_auroc", "coverage_90"):
        values = [report["per_action"][a][metric] for a in ACTION_NAMES]
        report["average"][metric] = None if None in values else float(np.mean(values))
    return report


def _censored_report(pred: Predictions) -> dict[str, dict[str, float]]:
    """Per action, the scores of the censored predictive a censored-pedal head trained with (:func:`censored_scores`)."""
    scores = censored_scores(pred.target, pred.latent_mean, pred.latent_variance, CENSORED_ACTIONS.numpy())
    return {action: {key: float(values[i]) for key, values in scores.items()} for i, action in enumerate(ACTION_NAMES)}


def _add_isotonic(report: dict[str, Any], pit: np.ndarray) -> None:
    """Add mace/rmsce/coverage_90 ``_isotonic`` (of the isotonic-recalibrated CDF, PIT values [N, A]) to ``report``."""
    curve = pit_calibration_curve(pit)
    columns = {"mace_isotonic": curve.mace, "rmsce_isotonic": curve.rmsce,
               "coverage_90_isotonic": np.mean(np.abs(2 * pit - 1) <= 0.9, axis=0)}
    for i, action in enumerate(ACTION_NAMES):
        report["per_action"][action].update({key: float(values[i]) for key, values in columns.items()})
    report["average"].update({key: float(np.mean(values)) for key, values in columns.items()})


def _split_auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """AUROC of ``score`` for the ``positive`` samples against the rest; None when either side is empty."""
    if positive.all() or not positive.any():
        return None
    return ood_auroc(score[~positive], score[positive])


def _ood_aurocs(clean: Predictions, shifted: Predictions) -> dict[str, Any]:
    """AUROC, clean (negative) against shifted (positive): per action and of the mean over actions of
    the total predictive std (the keys ``steer`` … and ``mean_std``), and under ``components`` of
    each uncertainty component on its own (``total``, ``aleatoric``, ``epistemic``: per action;
    ``density``: one per input, None when the run has no density; and each head signal, e.g. Lévy's
    ``deviation``, ``disagreement`` and ``evidence`` (negated: less evidence = less certain), per
    action). Recalibration scales each action's variance by a constant, so it changes none of these."""
    clean_std, shifted_std = clean.std, shifted.std
    out: dict[str, Any] = {a: ood_auroc(clean_std[:, i], shifted_std[:, i]) for i, a in enumerate(ACTION_NAMES)}
    out["mean_std"] = ood_auroc(clean_std.mean(1), shifted_std.mean(1))
    components: dict[str, Any] = {
        name: {a: ood_auroc(getattr(clean, name)[:, i], getattr(shifted, name)[:, i]) for i, a in enumerate(ACTION_NAMES)}
        for name in ("aleatoric", "epistemic")}
    components["total"] = {a: out[a] for a in ACTION_NAMES}
    both = clean.density is not None and shifted.density is not None
    components["density"] = ood_auroc(clean.density, shifted.density) if both else None  # type: ignore[arg-type]
    for name in (clean.signals or {}):
        sign = -1.0 if name == "evidence" else 1.0  # less evidence = less certain
        components[name] = {a: ood_auroc(sign * clean.signals[name][:, i], sign * shifted.signals[name][:, i])  # type: ignore[index]
                            for i, a in enumerate(ACTION_NAMES)}
    out["components"] = components
    return out


#: Table columns after the metrics: recalibrated metrics (isotonic when fitted) and the OOD AUROC of each component.
ISOTONIC_METRICS = ("mace_isotonic", "coverage_90_isotonic")
#: Lévy's calibrated deviation a·σ̂ + b scored as N(μ, s²): the ``_dev`` columns.
DEVIATION_METRICS = ("crps", "mace", "ause", "error_auroc")
OOD_COLUMNS = ("ood_auroc", "ood_auroc_epistemic", "ood_auroc_density", "ood_auroc_deviation")
#: a censored-pedal head scored under the censored predictive it trained with: the ``_censored`` columns.
CENSORED_METRICS = ("nll", "crps", "mace", "coverage_90")
#: the 95 % episode-bootstrap bounds shown in the table (offline.json holds those of mse, nll, crps and mace)
INTERVAL_COLUMNS = ("crps_lo", "crps_hi")
TABLE_METRICS = (*METRICS, *INTERVAL_COLUMNS, *(f"{m}_cal" for m in (*CALIBRATED_METRICS, *ISOTONIC_METRICS)),
                 *(f"{m}_dev" for m in DEVIATION_METRICS), *(f"{m}_censored" for m in CENSORED_METRICS), *OOD_COLUMNS)


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, condition, action) with every metric, ``<metric>_cal`` when the run is
    recalibrated, and the OOD AUROCs against clean (total std, epistemic, density) off clean."""
    rows = []
    for result in results:
        for condition, report in result["conditions"].items():
            ood = result.get("ood_auroc_conditions", {}).get(condition, {})
            for action in ACTION_NAMES:
                metrics = report["per_action"][action]
                recalibrated = report.get("per_action_calibrated", {}).get(action, {})
                row = {"model": result["model"], "run": Path(result["run"]).name, "recalibration": result["recalibration"],
                       "condition": condition, "action": action}
                row.update({m: metrics.get(m) for m in (*METRICS, *INTERVAL_COLUMNS)})
                row.update({f"{m}_cal": recalibrated.get(m) for m in (*CALIBRATED_METRICS, *ISOTONIC_METRICS)})
                deviation = report.get("per_action_deviation", {}).get(action, {})
                row.update({f"{m}_dev": deviation.get(m) for m in DEVIATION_METRICS})
                censored = report.get("per_action_censored", {}).get(action, {})
                row.update({f"{m}_censored": censored.get(m) for m in CENSORED_METRICS})
                components = ood.get("components", {})
                row["ood_auroc"] = ood.get(action)
                row["ood_auroc_epistemic"] = components.get("epistemic", {}).get(action)
                row["ood_auroc_density"] = components.get("density")
                row["ood_auroc_deviation"] = components.get("deviation", {}).get(action)
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
    columns = ["model", *(["recalibration"] if "recalibration" in rows[0] else []), "condition", "action",
               *(m for m in TABLE_METRICS if any(row.get(m) is not None for row in rows))]  # offline.csv keeps every column
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


def seed_repeats(runs: Sequence[Path], count: int, workers: int = 1, backend: str = "process",
                 address: str | None = None, on_trained: Callable[[Any], None] | None = None) -> dict[Path, list[Path]]:
    """Each run plus ``count − 1`` retrainings with seeds seed+1, … (in RUN/seed-repeats/seedN,
    resumable), trained as one sweep on a backend (:mod:`nsacdrive.controllers.sweep`);
    ``on_trained`` gets each retraining's :class:`nsacdrive.controllers.sweep.SweepResult` as it finishes."""
    import dataclasses

    from nsacdrive.controllers.sweep import train_sweep

    repeats, trainings = {}, []
    for run in runs:
        config = read_run_config(run)
        retrainings = [(dataclasses.replace(config, seed=config.seed + k), run / "seed-repeats" / f"seed{config.seed + k}")
                       for k in range(1, count)]
        trainings += retrainings
        repeats[run] = [run] + [folder for _, folder in retrainings]
    for result in train_sweep(trainings, workers, backend, address):
        if on_trained is not None:
            on_trained(result)
    return repeats


def check_seed_repeats(configs: dict[Path, TrainConfig]) -> None:
    """Refuse to pool runs of one model whose training configs differ in more than the seed (and
    the device they ran on): their mean ± std would mix recipes (ValueError naming both runs)."""
    first: dict[str, tuple[Path, dict[str, Any]]] = {}
    for run, config in configs.items():
        settings = replace(config, seed=0, device="auto").to_dict()
        name = config.model.model
        if name not in first:
            first[name] = (run, settings)
            continue
        other, reference = first[name]
        differing = sorted(key for key in settings if settings[key] != reference[key])
        if differing:
            raise ValueError(f"--by-model pools the runs of each model, but {other} and {run} ({name}) differ in "
                             f"{', '.join(differing)}, not only in the seed; evaluate them in separate calls")


def aggregate_seeds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with mean ± std over seed repeats of the same model (``<metric>_std`` columns added)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in table_rows(results):
        groups.setdefault((row["model"], row["condition"], row["action"]), []).append(row)
    aggregated = []
    for (model, condition, action), rows in groups.items():
        entry: dict[str, Any] = {"model": model, "run": f"{len(rows)} seeds", "condition": condition, "action": action}
        for metric in TABLE_METRICS:
            values = [r[metric] for r in rows if r[metric] is not None]
            entry[metric] = float(np.mean(values)) if values else None
            entry[f"{metric}_std"] = float(np.std(values)) if values else None
        aggregated.append(entry)
    return aggregated
