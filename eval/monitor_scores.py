"""Monitor scores: per-step numbers from a controller's prediction and state that may warn of a failure.

Shared by the offline judge (:mod:`nsacdrive.eval.monitor`, from per-step logs) and the closed
loop (:class:`LiveMonitor`, from each new prediction), so both compute exactly the same score.
Every score takes a dict of per-step arrays with the log's field names (``aleatoric``,
``epistemic`` [N, 3], ``density`` [N], ``attention`` [N, T], ``raw_action`` [N, 3], ``speed`` [N])
plus ``curvature`` [N], the largest |curvature| of the road 5–40 world units ahead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

#: Distances ahead (world units) over which the curvature baseline takes its largest |curvature|.
CURVATURE_DISTANCES = np.arange(5.0, 45.0, 5.0)

#: A score: the dict of per-step arrays (see the module docstring) → one number per step, shape [N].
ScoreFunction = Callable[[dict[str, np.ndarray]], np.ndarray]


def _std(part: str | None, action: int = 0) -> ScoreFunction:
    def score(arrays: dict[str, np.ndarray]) -> np.ndarray:
        variance = arrays["aleatoric"] + arrays["epistemic"] if part is None else arrays[part]
        return np.sqrt(np.maximum(variance[:, action], 0.0))
    return score


def _attention_entropy(arrays: dict[str, np.ndarray]) -> np.ndarray:
    p = np.clip(arrays["attention"], 1e-12, None)
    p = p / p.sum(1, keepdims=True)
    return -(p * np.log(p)).sum(1)


#: name → (what it is, whether it uses the model's uncertainty, per-step score from the log).
SCORES: dict[str, tuple[str, bool, ScoreFunction]] = {
    "steer_std": ("predictive steering std √(aleatoric + epistemic)", True, _std(None)),
    "steer_aleatoric": ("aleatoric steering std", True, _std("aleatoric")),
    "steer_epistemic": ("epistemic steering std", True, _std("epistemic")),
    "gas_std": ("predictive gas std", True, _std(None, 1)),
    "density": ("feature-density score of the frame (density.safetensors)", True, lambda a: a["density"]),
    "attention_entropy": ("entropy of the attention over the frames (attending heads)", True, _attention_entropy),
    "abs_steer": ("|predicted steering| (no uncertainty)", False, lambda a: np.abs(a["raw_action"][:, 0])),
    "speed": ("measured speed (no uncertainty)", False, lambda a: a["speed"]),
    "curvature": ("largest |curvature| 5–40 units ahead (no uncertainty, privileged map)", False, lambda a: a["curvature"]),
}


#: name → the log fields a score needs beyond the ones every log has (absent from older logs).
SCORE_INPUTS: dict[str, tuple[str, ...]] = {"density": ("density",), "attention_entropy": ("attention",)}


def score_inputs(name: str) -> tuple[str, ...]:
    """Log fields a score needs beyond the ones every log has (absent from older logs)."""
    return SCORE_INPUTS.get(name, ())


def register_score(name: str, description: str, uses_uncertainty: bool, fn: ScoreFunction, needs: Iterable[str] = ()) -> None:
    """Add score ``name`` to :data:`SCORES`, so the offline judge, :class:`LiveMonitor` and the closed
    loop's ``monitor_score`` all offer it. ``needs``: log fields beyond the ones every log has; a
    log without them skips the score. The registration lives in this process only."""
    if not name:
        raise ValueError("monitor score: a name must be non-empty")
    if name in SCORES:
        raise ValueError(f"monitor score {name!r} is already registered")
    SCORES[name] = (description, uses_uncertainty, fn)
    if needs := tuple(needs):
        SCORE_INPUTS[name] = needs


def smooth(values: np.ndarray, steps: int) -> np.ndarray:
    """Trailing mean over the last ``steps`` steps (fewer at the start): causal, as a monitor sees it."""
    total = np.cumsum(np.concatenate([[0.0], values]))
    index = np.arange(1, len(values) + 1)
    start = np.maximum(index - steps, 0)
    return (total[index] - total[start]) / (index - start)


class LiveMonitor:
    """One score computed at every closed-loop step, smoothed as :func:`smooth` does, against its threshold.

    No alarm is raised in the first ``warmup_steps`` steps, which the offline judge leaves out too."""

    def __init__(self, name: str, threshold: float, smooth_steps: int, warmup_steps: int) -> None:
        if name not in SCORES:
            raise ValueError(f"monitor score: expected one of {', '.join(SCORES)}, got {name!r}")
        self.compute = SCORES[name][2]
        self.threshold = threshold
        self.warmup_steps = warmup_steps
        self.recent: deque[float] = deque(maxlen=smooth_steps)
        self.steps = 0

    def update(self, step: dict[str, np.ndarray]) -> tuple[float, bool]:
        """The smoothed score after this step (arrays of one row each) and whether it alarms."""
        self.recent.append(float(self.compute(step)[0]))
        alarm_allowed = self.steps >= self.warmup_steps
        self.steps += 1
        value = float(np.mean(self.recent))
        return value, alarm_allowed and value > self.threshold
