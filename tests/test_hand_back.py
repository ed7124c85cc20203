"""The fallback's hand-back: the step-by-step switch, its whole-trace replay, and the hold chosen on development logs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsacdrive.envs.car_racing import FPS
from nsacdrive.eval.hand_back import HandBack, active_steps, choose_hold
from nsacdrive.eval.misbehaviour import Event
from nsacdrive.eval.monitor import EpisodeScores


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.4, 0.6, 0.9, 1.0, 1.3]), min_size=1, max_size=80),
       st.integers(1, 6), st.sampled_from([1.0, 0.8, 0.5]))
def test_the_replay_of_a_trace_is_the_switch_the_car_runs(scores, clear_steps, release):
    """:func:`active_steps` (no loop) says at every step what :class:`HandBack` (one step at a time) does."""
    scores = np.array(scores)
    alarm = scores > 1.0
    switch = HandBack(clear_steps, release)
    expected = [switch.update(s, a) for s, a in zip(scores, alarm, strict=True)]
    np.testing.assert_array_equal(active_steps(scores, alarm, clear_steps, release), expected)


def trace(alarms_at: list[int], steps: int, fail_at: int | None = None, warmup: int = 0) -> EpisodeScores:
    """A score of 0 with a spike of 2 at each of ``alarms_at`` (threshold 1), optionally failing at ``fail_at``."""
    score = np.zeros(steps)
    score[alarms_at] = 2.0
    events = [Event(fail_at, min(fail_at + FPS, steps), "off_road")] if fail_at is not None else []
    nominal = np.ones(steps, dtype=bool)
    nominal[:warmup] = False
    for event in events:
        nominal[max(event.onset - 3 * FPS, 0): event.end] = False
    return EpisodeScores("e", not events, events, {"s": score}, np.zeros(steps), nominal, warmup)


def test_no_alarm_is_raised_in_the_warmup():
    """A spike at step 8 of a 10-step warmup would hand over steps 8–10, one of them nominal; only the
    spike at 40 does (3 of the 50 nominal steps)."""
    episode = trace([8, 40], 60, warmup=10)
    choice = choose_hold([], [episode], "s", 1.0, holds_s=(3 / FPS,), budget=1.0)
    assert choice.candidates[0]["nominal_share"] == pytest.approx(3 / 50)


def test_the_hold_is_the_longest_within_the_nominal_budget():
    """Alarms one second apart, the last 0.9 s before a failure: only a hold over a second covers the run-up. The
    nominal laps alarm once per 1,000 steps, so a hold of h steps costs h/1000 of nominal steps."""
    failing = [trace([100, 100 + FPS, 100 + 2 * FPS], 400, fail_at=100 + 3 * FPS - 5)]
    nominal = [trace([500], 1000) for _ in range(3)]
    choice = choose_hold(failing, nominal, "s", 1.0, holds_s=(0.1, 0.5, 1.2, 2.0), budget=0.03)
    shares = {c["hold_s"]: c["nominal_share"] for c in choice.candidates}
    assert shares == pytest.approx({0.1: 0.005, 0.5: 0.025, 1.2: 0.06, 2.0: 0.1})
    assert choice.clear_steps == round(0.5 * FPS)
    covered = {c["hold_s"]: c["covered"] for c in choice.candidates}
    assert covered == pytest.approx({0.1: 0.1, 0.5: 0.5, 1.2: 1.0, 2.0: 1.0})  # of the last second before the onset
    generous = choose_hold(failing, nominal, "s", 1.0, holds_s=(0.1, 0.5, 1.2, 2.0), budget=0.06)
    assert generous.clear_steps == round(1.2 * FPS)


def test_the_shortest_hold_when_none_is_within_budget():
    nominal = [trace(list(range(0, 1000, 10)), 1000)]
    choice = choose_hold([], nominal, "s", 1.0, holds_s=(1.0, 0.2), budget=0.01)
    assert choice.clear_steps == round(0.2 * FPS)
    assert choice.to_dict()["hold_s"] == pytest.approx(0.2)
    assert all(c["covered"] is None and c["failures"] == 0 for c in choice.candidates)
