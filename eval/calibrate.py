"""``nsacdrive calibrate``: fit each run's recalibration on its own validation split and save it.

Predictions come from the raw controller (an existing ``calibration.json`` is ignored and
replaced), on the run's validation track seeds under default colours — never its test tracks —
with the model's own number of draws and a fixed seed. The fit
(:func:`nsacdrive.controllers.calibration.fit_calibration`) is written atomically as
``RUN/calibration.json``; the returned summary gives the validation NLL and MACE per action
before and after, so the effect is visible where it was fitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nsacdrive.common.seeds import parse_seeds
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.calibration import Calibration, data_fingerprint, fit_calibration, write_calibration
from nsacdrive.controllers.metrics import gaussian_nll, mace
from nsacdrive.controllers.run import load_run
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.data_collection.dataset import SequenceDataset
from nsacdrive.eval.offline import Predictions, evenly_spaced, predict_split


@dataclass(frozen=True)
class CalibrationSummary:
    run: Path
    calibration: Calibration
    nll: tuple[np.ndarray, np.ndarray]  # per action, before and after
    mace: tuple[np.ndarray, np.ndarray]

    def lines(self) -> list[str]:
        cal = self.calibration
        out = [f"{self.run}: {cal.samples} validation sequences (tracks {','.join(map(str, cal.val_seeds))}) → {self.run}/calibration.json"]
        for i, action in enumerate(ACTION_NAMES):
            widths = ", ".join(f"q̂[{level}] {q[i]:.2f}" for level, q in cal.conformal.items())
            out.append(f"  {action:<6} s² {cal.variance_scale[i]:8.3f}   NLL {self.nll[0][i]:7.3f} → {self.nll[1][i]:7.3f}   "
                       f"MACE {self.mace[0][i]:.3f} → {self.mace[1][i]:.3f}   {widths}")
        return out


def calibrate_run(run_dir: str | Path, data: str | Path, max_samples: int | None = None, seed: int = 0,
                  loaded: tuple[torch.nn.Module, TrainConfig] | None = None) -> CalibrationSummary:
    """Fit and write ``run_dir``'s calibration on its validation split of ``data``.

    ``loaded``: the run's raw controller and config (``load_run(run_dir, raw=True)``) when the
    caller holds them already."""
    run_dir = Path(run_dir)
    model, config = loaded if loaded is not None else load_run(run_dir, raw=True)
    seeds = parse_seeds(config.val_seeds, "val seeds")
    dataset = SequenceDataset(data, seeds, colour_presets=["default"], sequence_length=config.sequence_length,
                              frame_stride=config.frame_stride, observation=config.model.observation)
    if len(dataset) == 0:
        raise ValueError(f"{data}: no validation episodes of {run_dir} (tracks {config.val_seeds}, default colours)")
    fingerprint = data_fingerprint([record.sidecar["sha256"] for record in dataset.episodes])
    raw = predict_split(model, evenly_spaced(dataset, max_samples), config.model.predict_samples, seed=seed)
    calibration = fit_calibration(raw.target, raw.mean, raw.aleatoric + raw.epistemic, tuple(seeds), fingerprint)
    write_calibration(run_dir, calibration)
    scale = np.asarray(calibration.variance_scale)
    after = Predictions(raw.target, raw.mean, raw.aleatoric * scale, raw.epistemic * scale)
    nll = tuple(np.asarray(gaussian_nll(p.target, p.mean, p.std ** 2)) for p in (raw, after))
    calibration_error = tuple(np.asarray(mace(p.target, p.mean, p.std)) for p in (raw, after))
    return CalibrationSummary(run_dir, calibration, nll, calibration_error)  # type: ignore[arg-type]
