"""The safety protocol and the learned failure predictor, on constructed traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsacdrive.controllers.metrics import ood_auroc
from nsacdrive.envs.car_racing import FPS
from nsacdrive.eval.failure_predictor import fit_predictor, with_predictor
from nsacdrive.eval.misbehaviour import Event
from nsacdrive.eval.monitor import EpisodeScores
from nsacdrive.eval.predictor_features import PREDICTOR_SCORE, score_features
from nsacdrive.eval.protocol_config import ProtocolConfig, ProtocolTracks, check_family
from nsacdrive.eval.safety_protocol import (
    NOMINAL,
    ProtocolData,
    candidate_scores,
    family_of,
    judge_fold,
    protocol_evaluations,
    selected_rows,
)

STEPS = 600
WARMUP = FPS


@pytest.fixture(autouse=True)
def constructed_scores(monkeypatch):
    """The constructed traces' two scores, known to the score table for the length of a test."""
    from nsacdrive.eval.monitor_scores import SCORES

    for name in ("warning", "shift"):
        monkeypatch.setitem(SCORES, name, (f"constructed {name}", True, lambda arrays, name=name: arrays[name]))


def episode(name: str, clean: bool, fail_at: int | None, rng: np.random.Generator, shift: float = 0.0) -> EpisodeScores:
    """Two scores: ``warning`` ramps up in the 2 s before a failure, ``shift`` is high on every shifted
    episode whether or not it fails (a shift detector, not a failure predictor)."""
    warning = rng.normal(0.0, 0.1, STEPS)
    events = []
    if fail_at is not None:
        warning[fail_at - 2 * FPS: fail_at] += np.linspace(0.0, 3.0, 2 * FPS)
        events = [Event(fail_at, fail_at + FPS, "off_road")]
    nominal = np.ones(STEPS, dtype=bool)
    nominal[:WARMUP] = False
    for e in events:
        nominal[max(e.onset - 3 * FPS, 0): e.end] = False
    scores = {"warning": warning, "shift": shift + rng.normal(0.0, 0.1, STEPS)}
    return EpisodeScores(name, clean, events, scores, np.zeros(STEPS), nominal, WARMUP)


def family_episodes(rng: np.random.Generator, failing: int, harmless: int, prefix: str) -> list[EpisodeScores]:
    return ([episode(f"{prefix}-f{i}", False, 400, rng, shift=2.0) for i in range(failing)]
            + [episode(f"{prefix}-h{i}", False, None, rng, shift=2.0) for i in range(harmless)])


def clean_laps(rng: np.random.Generator, count: int, prefix: str) -> list[EpisodeScores]:
    return [episode(f"{prefix}-c{i}", True, None, rng) for i in range(count)]


def test_the_predictor_learns_failure_not_shift():
    """Trained where shifted episodes fail only sometimes, the predictor ranks the steps before a failure
    above shifted-but-nominal steps, which the shift score cannot."""
    rng = np.random.default_rng(0)
    train = [*clean_laps(rng, 6, "train"), *family_episodes(rng, 6, 6, "train")]
    predictor = fit_predictor(train)
    judged = with_predictor([*family_episodes(rng, 6, 6, "test")], predictor)
    before = np.concatenate([e.scores[PREDICTOR_SCORE][400 - FPS: 400] for e in judged if e.events])
    shifted = np.concatenate([e.scores[PREDICTOR_SCORE][e.nominal] for e in judged if not e.events])
    raw_before = np.concatenate([e.scores["shift"][400 - FPS: 400] for e in judged if e.events])
    raw_shifted = np.concatenate([e.scores["shift"][e.nominal] for e in judged if not e.events])
    assert ood_auroc(shifted, before) > 0.95
    assert ood_auroc(raw_shifted, raw_before) < 0.65
    assert predictor.scores == ("shift", "warning")


def test_the_predictor_needs_failures_and_nominal_driving():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="needs failures and nominal driving"):
        fit_predictor(clean_laps(rng, 3, "c"))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=200), st.data())
def test_features_are_causal(values, data):
    """A feature at step t never depends on a later step: what a car computes as it drives."""
    values = np.array(values)
    t = data.draw(st.integers(0, len(values) - 1))
    changed = values.copy()
    changed[t + 1:] = data.draw(st.floats(-1e3, 1e3))
    np.testing.assert_array_equal(score_features(values)[: t + 1], score_features(changed)[: t + 1])


def protocol_data(rng: np.random.Generator, families: tuple[str, ...]) -> ProtocolData:
    train = {NOMINAL: clean_laps(rng, 4, "train"), **{f: family_episodes(rng, 3, 3, f"train-{f}") for f in families}}
    test = {NOMINAL: clean_laps(rng, 4, "test"), **{f: family_episodes(rng, 3, 3, f"test-{f}") for f in families}}
    return ProtocolData(fit=clean_laps(rng, 12, "fit"), check=clean_laps(rng, 4, "check"), train=train, test=test)


def small_config() -> ProtocolConfig:
    from nsacdrive.eval.configs import MonitorConfig

    return ProtocolConfig(development=("fog", "rain"), test=("glare",), severities=(5,),
                          monitor=MonitorConfig(threshold="window-rate", false_alarm_rate=0.05))


def test_a_held_out_family_changes_nothing_that_is_fitted():
    """Leave-one-family-out: the held-out family's own episodes (training or test tracks) never reach the
    predictor, the thresholds or the selection."""
    config = small_config()
    data = protocol_data(np.random.default_rng(2), config.families)
    fold = judge_fold(data, ["glare"], config)
    other = np.random.default_rng(3)
    data.train["glare"] = [episode("odd", False, 300, other, shift=9.0) for _ in range(3)]
    data.test["glare"] = [episode("odd-test", False, 300, other, shift=9.0) for _ in range(3)]
    changed = judge_fold(data, ["glare"], config)
    assert changed["selected"] == fold["selected"] and changed["predictor"] == fold["predictor"]
    thresholds = {n: s["threshold"] for n, s in fold["families"]["glare"]["scores"].items()}
    assert thresholds == {n: s["threshold"] for n, s in changed["families"]["glare"]["scores"].items()}
    assert changed["families"]["glare"]["failures"] == 3


def test_the_selection_prefers_the_score_that_warns_of_failures():
    config = small_config()
    fold = judge_fold(protocol_data(np.random.default_rng(4), config.families), ["glare"], config)
    assert fold["selected"] in ("warning", PREDICTOR_SCORE)
    assert fold["selection_f3"]["warning"] > fold["selection_f3"]["shift"]
    judged = fold["families"]["glare"]["scores"][fold["selected"]]["windows"]["1"]
    assert judged["recall"] == 1.0 and judged["fpr_shifted"] < 0.2


def test_rows_name_each_family_with_the_monitor_chosen_without_it():
    config = small_config()
    data = protocol_data(np.random.default_rng(5), config.families)
    result = {"config": {"test": list(config.test)},
              "leave_one_family_out": {f: judge_fold(data, [f], config) for f in config.families}}
    rows = selected_rows(result)
    assert [r["family"] for r in rows] == ["fog", "rain", "glare"]
    assert [r["development"] for r in rows] == [True, True, False]


def test_families_tracks_and_config_are_checked():
    assert check_family("fog") == "fog" and check_family("random") == "random"
    with pytest.raises(ValueError, match="shift family 'default'"):
        check_family("default")
    with pytest.raises(ValueError, match="both development and test: fog"):
        ProtocolConfig(development=("fog",), test=("fog", "glare"))
    with pytest.raises(ValueError, match="severities"):
        ProtocolConfig(severities=(7,))
    with pytest.raises(ValueError, match="fit and test share seeds"):
        ProtocolTracks(train=(0,), fit=(5, 6), check=(7,), test=(6,))


def test_every_family_is_driven_on_train_and_test_tracks():
    config = ProtocolConfig(development=("fog",), test=("glare", "random"), severities=(3, 5))
    tracks = ProtocolTracks(train=(0, 1), fit=(10,), check=(11,), test=(12,))
    evaluations = protocol_evaluations("runs/x", tracks, config)
    assert set(evaluations) == {"fit", "check", "train-corrupted", "train-colours", "test-corrupted", "test-colours"}
    assert evaluations["test-corrupted"].corruptions == ("none", "fog-3", "fog-5", "glare-3", "glare-5")
    assert evaluations["train-colours"].colour_presets == ("random",) and evaluations["train-colours"].seeds == (0, 1)
    assert family_of({"corruption": "camera-zoom-3", "colour_preset": "default"}) == "camera-zoom"
    assert family_of({"corruption": "none", "colour_preset": "random"}) == "random"
    assert family_of({"corruption": "none", "colour_preset": "default"}) == NOMINAL


def test_candidates_leave_out_the_privileged_map():
    rng = np.random.default_rng(6)
    laps = clean_laps(rng, 2, "c")
    for lap in laps:
        lap.scores["curvature"] = np.zeros(STEPS)
    assert candidate_scores(laps) == ["shift", "warning"]


@pytest.mark.parametrize(("args", "message"), [
    (("--fit-seeds", "1000-1010"), "fit and test share seeds"),
    (("--test", "fog"), "both development and test: fog"),
    (("--severities", "3,9"), "severities"),
    (("--development", "fog,sunshine"), "shift family 'sunshine'"),
])
def test_the_command_refuses_bad_protocols_before_driving(tmp_path, args, message):
    from data_fixtures import normalize
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    result = CliRunner().invoke(app, ["protocol", str(tmp_path / "run"), "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and message in normalize(result.output)
    assert not (tmp_path / "out").exists()


def test_the_study_file_renders_every_fold_and_fallback_over_seeds(tmp_path):
    """bench.safety_protocol turns per-seed protocol results into a results file the docs render."""
    from bench.results import validate_study
    from bench.safety_protocol import study_tables
    from nsacdrive.common.atomic import json_safe
    from nsacdrive.eval.safety_protocol import judge_protocol, to_terminal

    config = small_config()
    results = []
    for seed in range(3):
        result = json_safe(judge_protocol(protocol_data(np.random.default_rng(10 + seed), config.families), config))
        result["fallbacks"] = {"stop": {"families": {"glare": {"episodes": 6, "failures_without": 3, "failures_with": seed,
                                                               "prevented": 1 - seed / 3, "ended_safely": 1.0, "safe_stops": 2,
                                                               "laps": 4}},
                                        "nominal": {"episodes": 4, "fallback_fraction": 0.01, "laps": 4, "lap_time_ratio": 1.01}}}
        results.append(result)
    assert "hand-back after" in to_terminal(results[0]) and "fallback stop" in to_terminal(results[0])
    tables = study_tables(results, [0, 1, 2])
    assert [t["name"] for t in tables] == ["Leave one family out", "Leave one family out: precision, recall, lead and AUROC",
                                           "Development and test families", "False alarms with a guarantee", "Fallback stop"]
    assert [row[0] for row in tables[0]["rows"]] == ["fog", "rain", "glare", "**pooled, per seed**", "**pooled, mean ± std**"]
    assert tables[4]["rows"][-2][:3] == ["**all test families**", "3 → 0 / 3 → 1 / 3 → 2", "1.00 / 0.67 / 0.33 (0.67 ± 0.27)"]
    provenance = {"command": ["nsacdrive protocol runs/x"], "commit": None, "dirty": None, "date": None,
                  "machine": {"cpu": None, "cores": 2, "gpu": None},
                  "versions": {"python": None, "torch": None, "numpy": None, "gymnasium": None}, "config_sha256": {}, "seeds": [0, 1, 2]}
    validate_study({"study": "safety-protocol", "title": "t", "provenance": provenance, "tables": tables}, "safety-protocol", "x")


def test_the_fallbacks_hand_back_after_the_hold_chosen_without_the_held_out_family():
    """Each fold picks the hand-back hold on its own development logs; the guarded drives use the split's."""
    from nsacdrive.eval.closed_loop import DriveConfig
    from nsacdrive.eval.safety_protocol import fallback_drive

    config = small_config()
    fold = judge_fold(protocol_data(np.random.default_rng(5), config.families), ["glare"], config)
    hold = fold["hand_back"]
    assert [c["hold_s"] for c in hold["candidates"]] == list(config.hold_candidates_s)
    within = [c for c in hold["candidates"] if c["nominal_share"] <= config.nominal_fallback_budget]
    assert hold["clear_steps"] == (within[-1] if within else hold["candidates"][0])["steps"]
    drive = fallback_drive(DriveConfig(), fold, config, "slow")
    assert drive.fallback_steps == hold["clear_steps"] and drive.monitor_score == fold["selected"]
