"""A learned failure predictor: the chance that the car fails within the next seconds, from what a
monitor in the car sees over the last seconds.

Per-frame scores flag *shift*; a controller that is confidently wrong under a shift shows little
of it. The predictor instead reads temporal features of every non-privileged score (its current
value, trailing means over 1 and 3 s, the trailing maximum and spread over 1 s and the trend over
the last second) and learns, by L2-regularised logistic regression with balanced classes, which
of them precede failures on logs of *training* tracks under *development* shift families: steps
in the ``horizon_s`` before a failure's onset are positives, nominal steps of every episode
(clean or shifted but not failing yet) negatives, so an alarm on a harmless shift costs as much as
a missed failure. Its output, the log-odds of a failure, is one more score: thresholded on nominal
laps like any other (:func:`nsacdrive.eval.monitor.fit_threshold`) and judged on tracks and
families it never saw (:mod:`nsacdrive.eval.safety_protocol`).

Every feature is causal (trailing windows only), so a car can compute it step by step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nsacdrive.envs.car_racing import FPS
from nsacdrive.eval.monitor import EpisodeScores, pre_failure_window
from nsacdrive.eval.predictor_features import PREDICTOR_SCORE, PRIVILEGED_SCORES, FailurePredictor, score_features
from nsacdrive.eval.protocol_config import PredictorConfig


def episode_features(episode: EpisodeScores, scores: Sequence[str]) -> np.ndarray:
    """[N, len(scores) · len(FEATURES)] features of one episode."""
    return np.concatenate([score_features(episode.scores[name]) for name in scores], axis=1)


def episode_labels(episode: EpisodeScores, horizon_s: float) -> np.ndarray:
    """Per step: 1 in the ``horizon_s`` before a failure's onset, 0 nominal, −1 neither (left out of training)."""
    labels = np.where(episode.nominal, 0, -1)
    length = round(horizon_s * FPS)
    for index in range(len(episode.events)):
        start, onset = pre_failure_window(episode, index, length)
        labels[start:onset] = 1
    return labels


def predictor_inputs(episodes: Sequence[EpisodeScores]) -> list[str]:
    """The non-privileged scores every episode has, in a fixed order."""
    names = sorted(set.intersection(*(set(e.scores) for e in episodes))) if episodes else []
    return [n for n in names if n not in PRIVILEGED_SCORES and n != PREDICTOR_SCORE]


def predictor_score(predictor: FailurePredictor, episode: EpisodeScores) -> np.ndarray:
    """[N] the predictor's log-odds at every step of one episode."""
    return predictor.log_odds(episode_features(episode, predictor.scores))


def fit_predictor(episodes: Sequence[EpisodeScores], config: PredictorConfig = PredictorConfig()) -> FailurePredictor:
    """Fit the predictor on ``episodes`` (logs of training tracks under development shifts). Raises
    ValueError when they hold no failure or no nominal step to learn from."""
    from scipy.optimize import minimize

    scores = predictor_inputs(episodes)
    if not scores:
        raise ValueError("failure predictor: the episodes share no non-privileged score")
    features = [episode_features(e, scores) for e in episodes]
    labels = [episode_labels(e, config.horizon_s) for e in episodes]
    x, y = np.concatenate(features), np.concatenate(labels)
    positives, negatives = x[y == 1], x[y == 0]
    if not len(positives) or not len(negatives):
        raise ValueError(f"failure predictor: needs failures and nominal driving to learn from, got {len(positives)} steps "
                         f"before failures and {len(negatives)} nominal steps")
    negatives = negatives[:: max(1, -(-len(negatives) // config.max_negatives))]
    x = np.concatenate([positives, negatives])
    y = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    weight = np.where(y == 1, 0.5 / len(positives), 0.5 / len(negatives))  # balanced classes, summing to 1
    centre = np.median(x, axis=0)
    spread = np.subtract(*np.percentile(x, [75, 25], axis=0))
    scale = np.where(spread > 0, spread, np.where(x.std(0) > 0, x.std(0), 1.0))
    standard = np.clip((x - centre) / scale, -FailurePredictor.clip, FailurePredictor.clip)
    signs = 2 * y - 1

    def loss(parameters: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = parameters[:-1], parameters[-1]
        margin = signs * (standard @ w + b)
        value = float(weight @ np.logaddexp(0.0, -margin) + 0.5 * config.l2 * w @ w)
        slope = -weight * signs * np.exp(-np.logaddexp(0.0, margin))  # d loss / d logit
        return value, np.concatenate([standard.T @ slope + config.l2 * w, [slope.sum()]])

    solution = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B")
    return FailurePredictor(tuple(scores), tuple(centre), tuple(scale), tuple(solution.x[:-1]), float(solution.x[-1]), config.horizon_s)


def with_predictor(episodes: Sequence[EpisodeScores], predictor: FailurePredictor) -> list[EpisodeScores]:
    """Copies of ``episodes`` whose scores include the predictor's (:data:`PREDICTOR_SCORE`)."""
    from dataclasses import replace

    return [replace(e, scores={**e.scores, PREDICTOR_SCORE: predictor_score(predictor, e)}) for e in episodes]
