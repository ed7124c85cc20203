"""The failure predictor's inputs and its fitted weights, importable without torch: the causal
features of a score's per-step values, computed alike from a whole log (the offline judge and the
fit, :mod:`nsacdrive.eval.failure_predictor`) and step by step in the car (:class:`LivePredictor`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nsacdrive.envs.car_racing import FPS
from nsacdrive.eval.monitor_scores import SCORES

#: scores a car cannot compute: the curvature baseline reads the privileged map
PRIVILEGED_SCORES = ("curvature",)
#: the name the predictor's output goes by among an episode's scores
PREDICTOR_SCORE = "failure_predictor"
#: trailing windows of the features, in steps
SHORT, LONG = FPS, 3 * FPS
FEATURES = ("value", "mean_1s", "mean_3s", "max_1s", "std_1s", "trend_1s")


def _trailing(values: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean and std over the last ``steps`` steps of the last axis (fewer at the start)."""
    padded = np.concatenate([np.zeros((*values.shape[:-1], 1)), values], axis=-1)
    total, squares = np.cumsum(padded, axis=-1), np.cumsum(padded ** 2, axis=-1)
    index = np.arange(1, values.shape[-1] + 1)
    start = np.maximum(index - steps, 0)
    count = index - start
    mean = (total[..., index] - total[..., start]) / count
    variance = np.maximum((squares[..., index] - squares[..., start]) / count - mean ** 2, 0.0)
    return mean, np.sqrt(variance)


def _trailing_max(values: np.ndarray, steps: int) -> np.ndarray:
    """Maximum over the last ``steps`` steps of the last axis (fewer at the start)."""
    padded = np.concatenate([np.full((*values.shape[:-1], steps - 1), -np.inf), values], axis=-1)
    return np.lib.stride_tricks.sliding_window_view(padded, steps, axis=-1).max(-1)


def score_features(values: np.ndarray) -> np.ndarray:
    """[..., N, len(FEATURES)] causal features of per-step values [..., N] (one score, or several stacked)."""
    values = np.asarray(values, dtype=np.float64)
    mean_short, std_short = _trailing(values, SHORT)
    mean_long, _ = _trailing(values, LONG)
    half, _ = _trailing(values, SHORT // 2)
    first = np.repeat(values[..., :1], SHORT // 2, axis=-1)  # the first value stands before the first half-second
    earlier = np.concatenate([first, half], axis=-1)[..., : values.shape[-1]]
    return np.stack([values, mean_short, mean_long, _trailing_max(values, SHORT), std_short, half - earlier], axis=-1)


#: the most steps a feature looks back (the trend's half-second before the last half-second sits inside it)
HISTORY = LONG + SHORT // 2


def _floats(values: Sequence[float], name: str, count: int) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    if len(values) != count or not all(math.isfinite(v) for v in values):
        raise ValueError(f"failure predictor {name}: expected {count} finite numbers, got {len(values)}")
    return values


@dataclass(frozen=True)
class FailurePredictor:
    """A fitted logistic regression over the :func:`score_features` of ``scores``: the log-odds of a
    failure within ``horizon_s``. Features are centred and scaled by the training data's median and
    interquartile range and clipped to ±``clip`` (a score far outside everything seen counts as far,
    not infinitely far). Plain numbers only, so a saved predictor is JSON and nothing in it runs."""

    scores: tuple[str, ...]
    centre: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    horizon_s: float
    clip: float = 10.0

    def __post_init__(self) -> None:
        scores = tuple(self.scores)
        unknown = [s for s in scores if s not in SCORES or s in PRIVILEGED_SCORES]
        if not scores or unknown or len(set(scores)) != len(scores):
            raise ValueError(f"failure predictor scores: expected distinct non-privileged scores of {', '.join(SCORES)}, "
                             f"got {list(scores)}")
        width = len(scores) * len(FEATURES)
        object.__setattr__(self, "scores", scores)
        for name in ("centre", "scale", "weights"):
            object.__setattr__(self, name, _floats(getattr(self, name), name, width))
        if not all(s > 0 for s in self.scale):
            raise ValueError("failure predictor scale: every feature's scale must be > 0")
        for name in ("bias", "horizon_s", "clip"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"failure predictor {name}: expected a finite number, got {getattr(self, name)}")
        if not (self.horizon_s > 0 and self.clip > 0):
            raise ValueError("failure predictor horizon_s and clip must be > 0")

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: str) -> FailurePredictor:
        """The predictor saved as ``data`` (a JSON object); a malformed one is a ValueError naming ``where``."""
        from nsacdrive.common.config_checks import config_from_dict

        try:
            return config_from_dict(cls, data, where)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    def log_odds(self, features: np.ndarray) -> np.ndarray:
        """[N] log-odds of [N, features] features."""
        standard = np.clip((features - np.asarray(self.centre)) / np.asarray(self.scale), -self.clip, self.clip)
        return standard @ np.asarray(self.weights) + self.bias


class LivePredictor:
    """The failure predictor's log-odds at every closed-loop step: each input score smoothed over
    ``smooth_steps`` as the logs' scores are (:func:`~nsacdrive.eval.monitor_scores.smooth`), its
    features over the last :data:`HISTORY` steps, exactly as the offline judge computes them (every
    score in one vectorised call). No alarm in the first ``warmup_steps`` steps."""

    def __init__(self, predictor: FailurePredictor, threshold: float, smooth_steps: int, warmup_steps: int) -> None:
        self.predictor = predictor
        self.computes = [SCORES[name][2] for name in predictor.scores]
        self.threshold = threshold
        self.smooth_steps = smooth_steps
        self.warmup_steps = warmup_steps
        self.raw = np.zeros((len(predictor.scores), 1024))
        self.smoothed = np.zeros_like(self.raw)
        self.steps = 0

    def update(self, step: dict[str, np.ndarray]) -> tuple[float, bool]:
        """The log-odds after this step (arrays of one row each) and whether it alarms."""
        t = self.steps
        if t == self.raw.shape[1]:  # a horizon beyond the buffer: double it
            self.raw, self.smoothed = (np.concatenate([a, np.zeros_like(a)], axis=1) for a in (self.raw, self.smoothed))
        self.raw[:, t] = [float(compute(step)[0]) for compute in self.computes]
        self.smoothed[:, t] = self.raw[:, max(0, t + 1 - self.smooth_steps): t + 1].mean(axis=1)
        self.steps = t + 1
        features = score_features(self.smoothed[:, max(0, t + 1 - HISTORY): t + 1])[:, -1, :]
        value = float(self.predictor.log_odds(features.reshape(1, -1))[0])
        return value, t >= self.warmup_steps and value > self.threshold
