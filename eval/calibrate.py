"""``nsacdrive calibrate``: fit each run's recalibration and feature density on its own data and save them.

Predictions come from the raw controller (an existing ``calibration.json`` is ignored and
replaced), on the run's validation track seeds under default colours — never its test tracks —
with the model's own number of draws and a fixed seed. The fit
(:func:`nsacdrive.controllers.calibration.fit_calibration`) is written atomically as
``RUN/calibration.json``; the returned summary gives the validation NLL and MACE per action
before and after, so the effect is visible where it was fitted.

The feature density (:mod:`nsacdrive.controllers.density`) is fitted on the run's training
tracks instead (it describes what the encoder was trained on): the newest frame of an evenly
spaced subset of at most ``density_samples`` training sequences, default colours, no
augmentation, written as ``RUN/density.safetensors``; over the tokens, or with ``density_source``
"tokens+conv" over the tokens and the convolutions' statistics too (the module docstring of
:mod:`nsacdrive.controllers.density` says when to prefer which).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nsacdrive.common.seeds import format_seeds, parse_seeds
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.calibration import Calibration, data_fingerprint, fit_calibration, write_calibration
from nsacdrive.controllers.density import DENSITY_FILE, FeatureDensity, attach_density, fit_density, write_density
from nsacdrive.controllers.metrics import gaussian_nll, mace
from nsacdrive.controllers.run import load_run
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.data_collection.dataset import SequenceDataset, batch_loader, network_frames
from nsacdrive.eval.modes import DENSITY_SAMPLES
from nsacdrive.eval.offline import Predictions, evenly_spaced, predict_split


@dataclass(frozen=True)
class CalibrationSummary:
    run: Path
    calibration: Calibration
    nll: tuple[np.ndarray, np.ndarray]  # per action, before and after
    mace: tuple[np.ndarray, np.ndarray]
    density: FeatureDensity
    density_val: np.ndarray  # the density score of the validation sequences

    def lines(self) -> list[str]:
        cal = self.calibration
        out = [f"{self.run}: {cal.samples} validation sequences (tracks {format_seeds(list(cal.val_seeds))}) → {self.run}/calibration.json ({cal.method})"]
        for i, action in enumerate(ACTION_NAMES):
            widths = ", ".join(f"q̂[{level}] {q[i]:.2f}" for level, q in cal.conformal.items())
            out.append(f"  {action:<6} s² {cal.variance_scale[i]:8.3f}   NLL {self.nll[0][i]:7.3f} → {self.nll[1][i]:7.3f}   "
                       f"MACE {self.mace[0][i]:.3f} → {self.mace[1][i]:.3f}   {widths}")
        if cal.deviation_scale is not None:
            a, b = cal.deviation_scale
            out.append("  deviation σ̂ → a·σ̂ + b (CRPS fit): " + ", ".join(f"{action} a {a[i]:.3g} b {b[i]:.3g}" for i, action in enumerate(ACTION_NAMES)))
        density = self.density
        out.append(f"  density: {density.features} features ({density.source}) of {density.samples} training sequences (tracks "
                   f"{format_seeds(list(density.train_seeds))}), jitter {density.jitter:.2g} → {self.run}/{DENSITY_FILE}; "
                   f"validation score median {np.median(self.density_val):.2f}, 95th percentile {np.quantile(self.density_val, 0.95):.2f} "
                   "(its mean over the training features is 1)")
        return out


def calibrate_run(run_dir: str | Path, data: str | Path, max_samples: int | None = None, seed: int = 0,
                  loaded: tuple[torch.nn.Module, TrainConfig] | None = None,
                  density_samples: int = DENSITY_SAMPLES, isotonic: bool = False, density_source: str = "tokens") -> CalibrationSummary:
    """Fit and write ``run_dir``'s calibration on its validation split of ``data`` and its density on its training split.

    ``loaded``: the run's raw controller and config (``load_run(run_dir, raw=True)``) when the
    caller holds them already. ``isotonic``: also fit the CDF recalibrator (Kuleshov et al. 2018).
    ``density_source``: the density's features (:data:`nsacdrive.controllers.density.DENSITY_SOURCES`)."""
    run_dir = Path(run_dir)
    model, config = loaded if loaded is not None else load_run(run_dir, raw=True)
    density = _fit_density(model, config, data, density_samples, run_dir, density_source)
    attach_density(model, density)
    seeds = parse_seeds(config.val_seeds, "val seeds")
    dataset = _clean_split(data, seeds, config, "validation", run_dir)
    fingerprint = data_fingerprint([record.sidecar["sha256"] for record in dataset.episodes])
    raw = predict_split(model, evenly_spaced(dataset, max_samples), config.model.predict_samples, seed=seed)
    deviation = (raw.signals or {}).get("deviation")  # Lévy attention's σ̂, mapped to action units too
    calibration = fit_calibration(raw.target, raw.mean, raw.aleatoric + raw.epistemic, tuple(seeds), fingerprint, isotonic=isotonic,
                                  deviation=deviation)
    write_calibration(run_dir, calibration)
    scale = np.asarray(calibration.variance_scale)
    after = Predictions(raw.target, raw.mean, raw.aleatoric * scale, raw.epistemic * scale)
    nll = tuple(np.asarray(gaussian_nll(p.target, p.mean, p.std ** 2)) for p in (raw, after))
    calibration_error = tuple(np.asarray(mace(p.target, p.mean, p.std)) for p in (raw, after))
    write_density(run_dir, density)
    return CalibrationSummary(run_dir, calibration, nll, calibration_error, density, raw.density)  # type: ignore[arg-type]


def _clean_split(data: str | Path, seeds: list[int], config: TrainConfig, split: str, run_dir: Path) -> SequenceDataset:
    dataset = SequenceDataset(data, seeds, colour_presets=["default"], sequence_length=config.sequence_length,
                              frame_stride=config.frame_stride, observation=config.model.observation,
                              camera_fov=config.model.camera_fov)
    if len(dataset) == 0:
        raise ValueError(f"{data}: no {split} episodes of {run_dir} (tracks {','.join(map(str, seeds))}, default colours)")
    return dataset


@torch.no_grad()
def _fit_density(model: torch.nn.Module, config: TrainConfig, data: str | Path, samples: int, run_dir: Path,
                 source: str) -> FeatureDensity:
    """The density of the newest frame's features over at most ``samples`` evenly spaced training sequences."""
    model.use_density_source(source)
    seeds = parse_seeds(config.train_seeds, "train seeds")
    dataset = _clean_split(data, seeds, config, "training", run_dir)
    features = []
    for batch in batch_loader(evenly_spaced(dataset, samples), 256):
        tokens = model.encode(network_frames(batch["frames"][:, -1:], dataset.kind), batch["speed"][:, -1:])
        features.append(model.density_features(tokens))
    fingerprint = data_fingerprint([record.sidecar["sha256"] for record in dataset.episodes])
    return fit_density(torch.cat(features), tuple(seeds), fingerprint, source)
