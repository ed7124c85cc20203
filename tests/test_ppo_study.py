"""The PPO-expert study's tables, on constructed curves and evaluations."""

from __future__ import annotations

import json

from bench.ppo_expert import SEEDS_ROW, curve_rows, seed_row, seeds_row, trained_steps
from nsacdrive.agents.ppo_curve import CurvePoint, best_point
from nsacdrive.agents.ppo_policy import POLICY_FILE


def point(steps: int, minutes: float, score: float, laps: float) -> CurvePoint:
    return CurvePoint(timesteps=steps, seconds=60 * minutes, score_mean=score, score_std=5.0, lap_rate=laps)


def test_best_has_the_most_laps_then_the_highest_score_and_is_the_first_of_ties():
    points = [point(50_000, 2, 800, 0.2), point(100_000, 4, 915, 0.9), point(150_000, 6, 921, 0.8),
              point(200_000, 8, 915, 0.9)]
    assert best_point(points).timesteps == 100_000  # a later tie is not strictly better


def test_a_seed_row_gives_the_held_out_figures_and_when_best_was_saved():
    held_out = {"aggregate": {"score_mean": 912.34, "score_std": 8.76, "score_min": 880.04, "lap_finished_rate": 0.97,
                              "mean_abs_lateral_error": 1.874}}
    points = [point(50_000, 2.0, 700, 0.0), point(100_000, 4.04, 915, 0.9), point(150_000, 6.0, 900, 0.8)]
    assert seed_row(1, held_out, points) == [1, "912.3 ± 8.8", 880.0, "97 %", 1.87, "100k", 4.0, 6.0]


def test_curve_rows_line_up_the_seeds_and_leave_gaps_empty():
    curves = {0: [point(50_000, 2, 700, 0.0), point(100_000, 4, 900, 0.5)], 1: [point(50_000, 2, 650, 0.1)]}
    assert curve_rows(curves) == [["50k", "700 / 0 %", "650 / 10 %"], ["100k", "900 / 50 %", None]]


def test_an_unfinished_training_has_trained_no_steps(tmp_path):
    assert trained_steps(tmp_path) == 0
    (tmp_path / POLICY_FILE).write_text(json.dumps({"num_timesteps": 4096}))
    assert trained_steps(tmp_path) == 4096


def test_the_seeds_row_gives_mean_and_sample_std_over_seeds():
    held = [{"aggregate": {"score_mean": m, "score_std": 1.0, "score_min": lo, "lap_finished_rate": laps,
                           "mean_abs_lateral_error": 2.0}} for m, lo, laps in ((910.0, 850.0, 0.95), (920.0, 700.0, 1.0), (930.0, 880.0, 0.9))]
    curves = [[point(100_000, 4.0, 900, 0.9), point(200_000, 8.0, 890, 0.8)]] * 3
    row = seeds_row(held, curves)
    assert row == [SEEDS_ROW, "920.0 ± 10.0", 700.0, "95 ± 5 %", 2.0, None, 4.0, 8.0]


def test_label_statistics_are_saved_and_read_back_when_written(tmp_path, monkeypatch):
    import bench.ppo_expert as study

    measured = []
    monkeypatch.setattr(study, "record", lambda spec, tracks, condition: measured.append((spec, condition.name)) or spec)
    monkeypatch.setattr(study, "smoothness", lambda episodes: {key: 1.0 for _, key, _ in study.LABEL_COLUMNS})
    cache, teachers = tmp_path / study.LABELS_FILE, {"pure pursuit": "expert"}
    stats = study.label_stats(teachers, cache, written=False)
    assert len(measured) == len(study.CONDITIONS) and json.loads(cache.read_text())["teachers"] == stats
    assert study.label_stats(teachers, cache, written=True) == stats and len(measured) == len(study.CONDITIONS)
    study.label_stats({**teachers, "PPO": "ppo:P"}, cache, written=True)  # only the teacher the file lacks is measured
    assert [spec for spec, _ in measured[len(study.CONDITIONS):]] == ["ppo:P"] * len(study.CONDITIONS)
    monkeypatch.setattr(study, "LABEL_TRACKS", [0, 1])  # other tracks: the saved figures are not theirs
    study.label_stats(teachers, cache, written=True)
    assert len(measured) == 3 * len(study.CONDITIONS)
    assert study.label_rows(teachers, stats)[0][:3] == ["pure pursuit", study.CONDITIONS[0].name, 1.0]
