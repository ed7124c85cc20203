"""bench/error_anatomy.py: each signal's error AUROC inside a condition."""

from __future__ import annotations

import numpy as np
import pytest

from bench.error_anatomy import signal_aurocs
from nsacdrive.eval.offline import Predictions


def predictions(std: np.ndarray, density: np.ndarray, mean_steer: np.ndarray) -> Predictions:
    n = len(std)
    mean = np.zeros((n, 3))
    mean[:, 0] = mean_steer
    variance = np.repeat(std[:, None] ** 2, 3, axis=1)
    return Predictions(target=np.zeros((n, 3)), mean=mean, aleatoric=variance, epistemic=np.zeros((n, 3)), density=density)


def test_a_signal_larger_on_the_errors_scores_one_and_a_smaller_one_zero():
    errors = np.array([False, False, True, True])
    pred = predictions(std=np.array([0.1, 0.2, 0.3, 0.4]), density=np.array([4.0, 3.0, 2.0, 1.0]), mean_steer=np.array([0.5, -0.5, 0.5, -0.5]))
    clean = predictions(std=np.full(4, 0.1), density=np.full(4, 1.0), mean_steer=np.zeros(4))
    aurocs = signal_aurocs(pred, errors, clean)
    assert aurocs["σ"] == pytest.approx(1.0) and aurocs["aleatoric"] == pytest.approx(1.0)
    assert aurocs["density"] == pytest.approx(0.0)  # smaller on the errors: the inversion the engineering notes report
    assert aurocs["|predicted steer|"] == pytest.approx(0.5) and aurocs["epistemic"] == pytest.approx(0.5)
    # σ² + density with the density in σ² units (clean medians 0.01 and 1): 0.01+0.04, 0.04+0.03, 0.09+0.02, 0.16+0.01
    assert aurocs["σ² + density"] == pytest.approx(1.0)


def test_without_errors_every_auroc_is_undefined():
    pred = predictions(std=np.array([0.1, 0.2]), density=np.array([1.0, 2.0]), mean_steer=np.zeros(2))
    assert all(np.isnan(v) for v in signal_aurocs(pred, np.array([False, False]), pred).values())
