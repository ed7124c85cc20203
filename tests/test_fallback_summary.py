"""bench/fallback_summary: failures prevented, laps, lap time and fallback shares, counted by hand."""

from __future__ import annotations

import argparse
import math

import pytest

from bench.fallback_summary import Episode, parse_pair, seed_effect, to_markdown


def test_the_effect_of_a_fallback_is_counted_on_the_episodes_both_sides_drove():
    without = {("default", "none", 1, 0): Episode(True, 0, True, 700, 0),
               ("default", "none", 2, 0): Episode(True, 0, True, 800, 0),
               ("default", "fog-5", 1, 0): Episode(False, 3, False, 1000, 0),
               ("random", "none", 1, 0): Episode(False, 1, True, 750, 0),
               ("default", "jpeg-5", 1, 0): Episode(False, 9, False, 1000, 0)}  # not driven with the fallback: ignored
    with_fallback = {("default", "none", 1, 0): Episode(True, 0, True, 707, 14),
                     ("default", "none", 2, 0): Episode(True, 0, False, 1000, 6),  # lap lost: out of the lap time
                     ("default", "fog-5", 1, 0): Episode(False, 1, True, 800, 400),
                     ("random", "none", 1, 0): Episode(False, 0, True, 760, 0)}
    effect = seed_effect("s0", without, with_fallback)
    assert effect.failures == (4, 1) and effect.prevented == pytest.approx(0.75)
    assert effect.laps_shifted == (0.5, 1.0)
    assert effect.lap_time_change == pytest.approx(707 / 700 - 1)
    assert effect.nominal_fallback_share == pytest.approx(20 / 1707)
    assert effect.shifted_fallback_share == pytest.approx(400 / 1560)
    assert effect.pairs == 4
    table = to_markdown([effect, seed_effect("s1", without, without)])
    assert "| s0 | 4 → 1 | 75% | 50% → 100% | +1.0% | 1.2% | 26% | 4 |" in table
    assert "| mean ± std | | 38 ± 38 % |" in table  # the second seed prevents nothing


def test_a_seed_without_failures_has_no_share_prevented_and_disjoint_sides_are_refused():
    clean = {("default", "none", 1, 0): Episode(True, 0, True, 700, 0)}
    assert math.isnan(seed_effect("s", clean, clean).prevented)
    with pytest.raises(ValueError, match="share no episode"):
        seed_effect("s", clean, {("default", "none", 2, 0): Episode(True, 0, True, 700, 0)})


def test_pairs_name_both_sides():
    label, without, with_fallback = parse_pair("s0=a,b:c")
    assert label == "s0" and [p.name for p in without] == ["a", "b"] and [p.name for p in with_fallback] == ["c"]
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL=DIR"):
        parse_pair("s0=a,b")
