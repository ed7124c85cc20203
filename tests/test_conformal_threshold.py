"""The conformal alarm threshold: on known data, new nominal windows alarm at most at the target
rate with at least the stated confidence, and too few windows are refused with the number needed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from nsacdrive.eval.monitor import conformal_rank, conformal_threshold


def test_the_rank_is_the_smallest_with_the_guarantee():
    n, rate, confidence = 200, 0.05, 0.9
    k = conformal_rank(n, rate, confidence)
    assert stats.beta.cdf(1 - rate, k, n + 1 - k) <= 1 - confidence < stats.beta.cdf(1 - rate, k - 1, n + 2 - k)
    assert k > math.ceil((n + 1) * (1 - rate))  # stricter than the marginal split-conformal rank


def test_uniform_scores_keep_the_rate_with_the_stated_confidence():
    """Scores uniform on [0, 1]: a threshold t is exceeded with probability exactly 1 − t, so the
    share of calibrations whose true false-alarm rate breaks the target is known exactly."""
    rng = np.random.default_rng(7)
    rate, confidence, n, trials = 0.05, 0.9, 300, 4000
    true_rates = np.array([1.0 - conformal_threshold(rng.random(n), rate, confidence) for _ in range(trials)])
    broken = np.mean(true_rates > rate)
    assert broken <= (1 - confidence) + 3 * math.sqrt(confidence * (1 - confidence) / trials)
    assert np.median(true_rates) < rate  # and it is not vacuous: the threshold is not the maximum
    plain = np.array([1.0 - np.quantile(rng.random(n), 1 - rate) for _ in range(trials)])
    assert np.mean(plain > rate) > 0.3  # the uncorrected quantile breaks the rate about half the time


def test_too_few_windows_are_refused_with_the_number_needed():
    with pytest.raises(ValueError, match=r"needs at least 45 nominal windows of one second, got 20"):
        conformal_threshold(np.arange(20.0), 0.05, 0.9)
    assert conformal_threshold(np.arange(45.0), 0.05, 0.9) == 44.0  # 45 windows: only the largest qualifies
