"""Post-hoc recalibration of a run's predictive variance, fitted on its validation split.

A trained head can be over- or under-confident by a roughly constant factor (NSAC's steering
σ on the demo data: MACE 0.158 after the variance floor). Two standard repairs, per action:

* **variance scaling** (Levi et al. 2019): σ²_cal = s²·σ², with s² = mean((y − μ)² / σ²) over
  the validation samples, the factor that maximises the Gaussian likelihood for fixed (μ, σ²)
  (closed form: set ∂NLL/∂s² = 0). Aleatoric and epistemic parts are both scaled, so their
  shares are kept;
* **split-conformal widths** (Vovk et al. 2005; Angelopoulos & Bates 2021): for each level
  1 − α, q̂ is the ⌈(n+1)(1−α)⌉-th smallest score |y − μ| / σ_cal on the same validation split
  (:func:`nsacdrive.controllers.levy_calibration.conformal_quantile`), and μ ± q̂·σ_cal is the
  interval. Coverage holds for exchangeable data; closed-loop driving is not exchangeable, so
  read the widths as a monitored scale.

* optionally **isotonic recalibration of the predictive CDF** (Kuleshov et al. 2018): a monotone
  map R with R(F(y)) uniform on the validation split, F the variance-scaled Gaussian CDF. Their
  recalibrator is the isotonic regression of the empirical CDF P̂ of the PIT values u_i = F(y_i)
  on u_i; P̂ is already monotone in u, so that regression is P̂ itself. It is kept as the PIT
  quantiles at :data:`ISOTONIC_LEVELS` (101 knots per action, linear in between), so R(u) =
  interp(u, quantiles, levels). R changes quantiles and intervals, not the mean or variance:
  it is used for calibration curves and interval coverage (:meth:`Calibration.recalibrated_pit`),
  while every prediction still carries the variance-scaled moments.

* for heads that report Lévy attention's **deviation σ̂** (``signals["deviation"]``), the
  action-unit scale s = a·σ̂ + b per action, fitted by CRPS on the same split
  (:func:`nsacdrive.controllers.levy_calibration.fit_affine_scale`, docs/levy.md#calibration);
  evaluation scores N(μ, s²) beside the head's own variance.

The fit is written as ``RUN/calibration.json`` (method, per-action values, the validation
seeds, the number of samples and a fingerprint of the episodes it saw) and applied by
:meth:`Calibration.apply` wherever the run predicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.levy_calibration import conformal_quantile, conformal_scores, fit_affine_scale
from nsacdrive.controllers.prediction import UncertainPrediction

CALIBRATION_FILE = "calibration.json"
METHOD = "variance-scaling"
METHOD_ISOTONIC = "variance-scaling+isotonic"
CONFORMAL_ALPHAS = (0.1, 0.05)
#: The levels at which the isotonic recalibrator keeps the validation PIT quantiles.
ISOTONIC_LEVELS = np.linspace(0.0, 1.0, 101)


class CalibrationError(ValueError):
    """A calibration file that cannot be used, with the file and the field in the message."""


@dataclass(frozen=True)
class Calibration:
    """Per-action variance factors and conformal widths, fitted on one run's validation split."""

    variance_scale: tuple[float, ...]  # s² per action (ACTION_NAMES order)
    conformal: dict[str, tuple[float, ...]]  # "0.1" → q̂ per action, in units of σ_cal
    val_seeds: tuple[int, ...]
    samples: int
    data_fingerprint: str
    #: per action, the validation PIT quantiles at ISOTONIC_LEVELS (the isotonic recalibrator), or None
    isotonic: tuple[tuple[float, ...], ...] | None = None
    #: (a, b) per action mapping Lévy's deviation σ̂ to the scale a·σ̂ + b, or None for other heads
    deviation_scale: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def deviation_std(self, deviation: npt.ArrayLike) -> np.ndarray:
        """a·σ̂ + b per action for σ̂ [N, A] (ValueError when this calibration has no deviation scale)."""
        if self.deviation_scale is None:
            raise ValueError("this calibration has no deviation scale (the run's head reports no σ̂)")
        a, b = (np.asarray(v) for v in self.deviation_scale)
        return a * np.asarray(deviation, dtype=np.float64) + b

    @property
    def method(self) -> str:
        return METHOD if self.isotonic is None else METHOD_ISOTONIC

    def recalibrated_pit(self, target: npt.ArrayLike, mean: npt.ArrayLike, variance: npt.ArrayLike) -> np.ndarray:
        """R(F(y)) per sample and action, arrays [N, A] of raw predictions: the PIT under the variance-scaled
        Gaussian F, mapped through the isotonic recalibrator (F(y) itself when there is none)."""
        y, mu, var = (np.asarray(a, dtype=np.float64) for a in (target, mean, variance))
        pit = gaussian_pit(y, mu, var * np.asarray(self.variance_scale))
        if self.isotonic is None:
            return pit
        return np.stack([np.interp(pit[:, i], knots, ISOTONIC_LEVELS) for i, knots in enumerate(self.isotonic)], axis=1)

    def apply(self, prediction: UncertainPrediction) -> UncertainPrediction:
        """The prediction with both variance parts scaled by s² (mean, attention, density and a censored head's latent Gaussian unchanged)."""
        scale = torch.tensor(self.variance_scale, dtype=prediction.aleatoric.dtype, device=prediction.aleatoric.device)
        return dataclasses.replace(prediction, aleatoric=prediction.aleatoric * scale, epistemic=prediction.epistemic * scale)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["actions"] = list(ACTION_NAMES)
        out["method"] = self.method
        for optional in ("isotonic", "deviation_scale"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = CALIBRATION_FILE) -> Calibration:
        if raw.get("method") not in (METHOD, METHOD_ISOTONIC):
            raise CalibrationError(f"{where}: method {raw.get('method')!r} is not {METHOD!r} or {METHOD_ISOTONIC!r}")
        if raw.get("actions") != list(ACTION_NAMES):
            raise CalibrationError(f"{where}: actions {raw.get('actions')!r}, expected {list(ACTION_NAMES)}")
        scale = raw.get("variance_scale")
        if not (isinstance(scale, list) and len(scale) == len(ACTION_NAMES) and all(_positive(v) for v in scale)):
            raise CalibrationError(f"{where}: variance_scale must be {len(ACTION_NAMES)} positive numbers, got {scale!r}")
        conformal = raw.get("conformal", {})
        for level, widths in conformal.items():
            if not (isinstance(widths, list) and len(widths) == len(ACTION_NAMES)):
                raise CalibrationError(f"{where}: conformal[{level!r}] must hold {len(ACTION_NAMES)} widths, got {widths!r}")
        isotonic = raw.get("isotonic")
        if raw["method"] == METHOD_ISOTONIC:
            if not (isinstance(isotonic, list) and len(isotonic) == len(ACTION_NAMES)
                    and all(isinstance(q, list) and len(q) == len(ISOTONIC_LEVELS) and all(np.diff(q) >= 0) for q in isotonic)):
                raise CalibrationError(f"{where}: isotonic must hold, per action, {len(ISOTONIC_LEVELS)} non-decreasing PIT quantiles")
        deviation = raw.get("deviation_scale")
        if deviation is not None and not (isinstance(deviation, list) and len(deviation) == 2
                                          and all(isinstance(v, list) and len(v) == len(ACTION_NAMES) and all(_nonnegative(x) for x in v)
                                                  for v in deviation)):
            raise CalibrationError(f"{where}: deviation_scale must be [a, b], each {len(ACTION_NAMES)} numbers >= 0, got {deviation!r}")
        return cls(tuple(float(v) for v in scale), {k: tuple(float(w) for w in v) for k, v in conformal.items()},
                   tuple(int(s) for s in raw["val_seeds"]), int(raw["samples"]), str(raw["data_fingerprint"]),
                   tuple(tuple(float(v) for v in q) for q in isotonic) if raw["method"] == METHOD_ISOTONIC else None,
                   None if deviation is None else (tuple(map(float, deviation[0])), tuple(map(float, deviation[1]))))


def calibrated(calibration: Calibration | None, prediction: UncertainPrediction) -> UncertainPrediction:
    """``prediction`` recalibrated by ``calibration``, or unchanged when there is none."""
    return prediction if calibration is None else calibration.apply(prediction)


def _positive(value: object) -> bool:
    return _nonnegative(value) and value > 0  # type: ignore[operator]


def _nonnegative(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value)) and value >= 0


def gaussian_pit(y: np.ndarray, mean: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Φ((y − μ)/σ): the probability integral transform of y under N(μ, σ²)."""
    return torch.special.ndtr(torch.from_numpy((y - mean) / np.sqrt(variance))).numpy()


def fit_calibration(target: npt.ArrayLike, mean: npt.ArrayLike, variance: npt.ArrayLike, val_seeds: tuple[int, ...],
                    data_fingerprint: str, alphas: tuple[float, ...] = CONFORMAL_ALPHAS, isotonic: bool = False,
                    deviation: npt.ArrayLike | None = None) -> Calibration:
    """Variance factors and conformal widths (with ``isotonic`` the CDF recalibrator, with Lévy's
    ``deviation`` σ̂ its affine scale) from validation predictions, arrays [N, A]."""
    y, mu, var = (np.asarray(a, dtype=np.float64) for a in (target, mean, variance))
    if y.ndim != 2 or y.shape != mu.shape or y.shape != var.shape or y.shape[1] != len(ACTION_NAMES):
        raise ValueError(f"target, mean and variance must all be [N, {len(ACTION_NAMES)}], got {y.shape}, {mu.shape}, {var.shape}")
    if len(y) < 2:
        raise ValueError(f"calibration needs at least 2 validation samples, got {len(y)}")
    if not np.all(var > 0):
        raise ValueError("predictive variances must be > 0 to calibrate")
    smallest = min(alphas)
    if len(y) + 1 < 1 / smallest:  # the rank ⌈(n+1)(1−α)⌉ would exceed n: an infinite width
        raise ValueError(f"conformal widths at α = {smallest} need at least {int(np.ceil(1 / smallest)) - 1} validation samples, got {len(y)}")
    residual_sq = np.square(y - mu)
    scale = np.maximum(np.mean(residual_sq / var, axis=0), np.finfo(np.float64).tiny)
    scores = conformal_scores(y, mu, np.sqrt(var * scale))
    conformal = {str(alpha): tuple(float(q) for q in conformal_quantile(scores, alpha)) for alpha in alphas}
    recalibrator = None
    if isotonic:
        pit = gaussian_pit(y, mu, var * scale)
        recalibrator = tuple(tuple(float(q) for q in np.quantile(pit[:, i], ISOTONIC_LEVELS)) for i in range(y.shape[1]))
    deviation_scale = None
    if deviation is not None:
        a, b = fit_affine_scale(mu, np.asarray(deviation, dtype=np.float64), y)
        deviation_scale = (tuple(a.tolist()), tuple(b.tolist()))
    return Calibration(tuple(float(s) for s in scale), conformal, tuple(val_seeds), len(y), data_fingerprint, recalibrator,
                       deviation_scale)


def data_fingerprint(sha256s: list[str]) -> str:
    """One sha256 over the (sorted) sha256s of the episodes a calibration was fitted on."""
    return hashlib.sha256("\n".join(sorted(sha256s)).encode()).hexdigest()


def write_calibration(run_dir: str | Path, calibration: Calibration) -> Path:
    path = Path(run_dir) / CALIBRATION_FILE
    atomic_write_json(path, calibration.to_dict())
    return path


def read_calibration(run_dir: str | Path) -> Calibration | None:
    """The run's calibration, or None when it has none (``nsacdrive calibrate`` writes it)."""
    path = Path(run_dir) / CALIBRATION_FILE
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CalibrationError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    try:
        return Calibration.from_dict(raw, str(path))
    except KeyError as exc:
        raise CalibrationError(f"{path}: missing field {exc}") from exc
