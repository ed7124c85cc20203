"""Misbehaviour events on constructed traces, and the monitor protocol (thresholds, windows, F3) by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_fixtures import tiny_run
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.eval.misbehaviour import Event, EventConfig, misbehaviour, misbehaviour_events
from nsacdrive.eval.monitor import (
    EpisodeScores,
    MonitorConfig,
    WindowCounts,
    count_windows,
    frame_labels,
    frame_metrics,
    gamma_threshold,
    nominal_windows,
    smooth,
    window_rate_threshold,
)

FPS = 50


def trace(n: int = 800) -> dict[str, np.ndarray]:
    """A car on the centreline at cruising speed, after a standing start."""
    speed = np.full(n, 60.0)
    speed[:40] = np.linspace(0, 60, 40)
    return {"lateral_error": np.zeros(n), "heading_error": np.zeros(n), "speed": speed}


# --------------------------------------------------------------------------- events


def test_a_nominal_lap_with_a_standing_start_has_no_event():
    assert misbehaviour_events(trace(), "lap_finished") == []


def test_each_kind_of_misbehaviour_is_found_at_its_onset():
    a = trace()
    a["lateral_error"][200:230] = 7.0  # just beyond the half width 6.67
    a["heading_error"][400:420] = -2.0  # facing backwards
    a["speed"][600:] = 0.5  # stopped for 4 s
    events = misbehaviour_events(a, "time_limit")
    assert events == [Event(200, 230, "off_road"), Event(400, 420, "spin"), Event(600, 800, "stall")]


def test_symptoms_closer_than_the_recovery_time_are_one_failure():
    a = trace()
    a["lateral_error"][200:220] = 8.0
    a["lateral_error"][220 + FPS - 1: 260 + FPS] = -8.0  # back on the road for 49 steps < 50
    a["lateral_error"][400:410] = 9.0  # 90+ steps later: a new failure
    events = misbehaviour_events(a, "time_limit")
    assert [(e.onset, e.end) for e in events] == [(200, 260 + FPS), (400, 410)]


def test_a_short_slowdown_is_no_stall_and_leaving_the_playfield_is_an_event_on_the_last_step():
    a = trace()
    a["speed"][300:300 + 2 * FPS - 1] = 0.0  # one step short of 2 s
    assert not misbehaviour(a, "time_limit")["stall"].any()
    events = misbehaviour_events(a, "left_playfield")
    assert events == [Event(799, 800, "left_playfield")]
    a["lateral_error"][780:] = 9.0
    assert misbehaviour_events(a, "left_playfield") == [Event(780, 800, "off_road")]  # the same failure


def test_event_config_changes_what_counts():
    a = trace()
    a["lateral_error"][100:120] = 5.0
    assert misbehaviour_events(a, "time_limit") == []
    assert misbehaviour_events(a, "time_limit", EventConfig(half_width=4.0)) == [Event(100, 120, "off_road")]


# --------------------------------------------------------------------------- scores and thresholds


def test_smoothing_is_a_trailing_mean_that_never_looks_ahead():
    values = np.array([0.0, 3.0, 6.0, 9.0, 100.0])
    np.testing.assert_allclose(smooth(values, 3), [0.0, 1.5, 3.0, 6.0, 115 / 3])


def test_the_gamma_threshold_recovers_the_quantile_of_gamma_data():
    from scipy import stats

    values = stats.gamma.rvs(2.5, scale=0.3, size=20_000, random_state=np.random.default_rng(0))
    expected = stats.gamma.ppf(0.95, 2.5, scale=0.3)
    # maximum likelihood on 20,000 samples: the quantile within 2 % (its s.e. is ~0.5 %)
    assert gamma_threshold(values, 0.95) == pytest.approx(expected, rel=0.02)
    with pytest.raises(ValueError, match="2 distinct"):
        gamma_threshold(np.ones(10), 0.95)


def test_the_window_rate_threshold_is_exceeded_by_that_share_of_windows():
    maxima = np.arange(100.0)
    threshold = window_rate_threshold(maxima, 0.05)
    assert np.mean(maxima > threshold) == pytest.approx(0.05, abs=0.011)


# --------------------------------------------------------------------------- windows by hand


def episode(steps: int, events: list[Event], score: np.ndarray, warmup: int = 0, margin_s: int = 3) -> EpisodeScores:
    nominal = np.ones(steps, dtype=bool)
    nominal[:warmup] = False
    for e in events:
        nominal[max(e.onset - margin_s * FPS, 0): e.end] = False
    return EpisodeScores("ep", True, events, {"s": score}, np.zeros(steps), nominal, warmup)


def test_windows_counted_by_hand():
    """600 steps; one failure at step 500 (ends 550); an alarm 40 steps before it and one at step 30.

    Nominal steps: 0–349 (3 s margin before 500) and 550–599. At 1 s: windows 0–49 (alarm at 30: FP),
    50–99, …, 300–349 (six TN), 550–599 (TN) → FP 1, TN 7; the failure: alarm at 460 inside
    [450, 500) → TP, lead 0.8 s. At 2 s: windows 0–99 (FP), 100–199, 200–299 (TN; 300–349 is
    too short) and none after the failure → FP 1, TN 2; TP with the same lead."""
    score = np.zeros(600)
    score[30] = score[460] = 5.0
    ep = episode(600, [Event(500, 550, "off_road")], score)
    assert nominal_windows(ep, 50)[0] == (0, 50) and len(nominal_windows(ep, 50)) == 8
    one = count_windows([ep], "s", 1.0, 1)
    assert (one.tp, one.fn, one.fp, one.tn) == (1, 0, 1, 7) and one.leads_s == (0.8,)
    two = count_windows([ep], "s", 1.0, 2)
    assert (two.tp, two.fn, two.fp, two.tn) == (1, 0, 1, 2)
    missed = count_windows([ep], "s", 10.0, 1)
    assert (missed.tp, missed.fn, missed.fp, missed.tn) == (0, 1, 0, 8)
    shifted = EpisodeScores("shifted", False, ep.events, ep.scores, ep.curvature, ep.nominal, ep.warmup)
    apart = count_windows([shifted], "s", 1.0, 1)  # a corrupted episode: its nominal windows are counted apart
    assert (apart.tp, apart.fn, apart.fp, apart.tn, apart.fp_shifted, apart.tn_shifted) == (1, 0, 0, 0, 1, 7)
    assert apart.to_dict()["fpr_shifted"] == 1 / 8 and apart.fpr is None


def test_f3_precision_recall_and_fpr_by_hand():
    counts = WindowCounts(tp=8, fp=20, fn=2, tn=80, leads_s=(0.5, 1.0, 2.0))
    assert counts.f3 == pytest.approx(8 / (8 + 0.1 * 20 + 0.9 * 2))
    assert counts.precision == pytest.approx(8 / 28) and counts.recall == pytest.approx(0.8) and counts.fpr == pytest.approx(0.2)
    assert counts.to_dict()["median_lead_s"] == 1.0
    assert WindowCounts(0, 0, 0, 0, ()).to_dict()["f3"] is None


def test_frame_labels_and_metrics_of_a_perfect_warning():
    score = np.zeros(600)
    score[450:500] = 1.0  # high exactly in the second before the failure
    ep = episode(600, [Event(500, 550, "spin")], score, warmup=50)
    labels = frame_labels(ep)
    assert (labels[450:500] == 1).all() and (labels[50:350] == 0).all() and (labels[:50] == -1).all() and (labels[350:450] == -1).all()
    metrics = frame_metrics([ep], "s", strata=1)
    assert metrics["auroc"] == 1.0 and metrics["auprc"] == 1.0 and metrics["stratified_auroc"] == 1.0


def test_a_failure_in_the_warm_up_is_not_counted():
    ep = episode(300, [Event(20, 60, "off_road")], np.zeros(300), warmup=50)
    counts = count_windows([ep], "s", 1.0, 1)
    assert counts.tp + counts.fn == 0


def test_monitor_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="threshold"):
        MonitorConfig(threshold="median")
    with pytest.raises(ValueError, match="windows_s"):
        MonitorConfig(windows_s=())


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop

    folder = tmp_path_factory.mktemp("monitor")
    run = tiny_run(folder, seeds=(0, 1), split=("0", "1", "2"))
    evaluate_closed_loop(EvalConfig(runs=[run], seeds=[3, 4], colour_presets=["default", "shift-3"],
                                    drive=DriveConfig(max_steps=150)), folder / "eval", progress=False)
    return folder / "eval"


def test_the_command_writes_every_score_with_its_windows(evaluation, tmp_path):
    result = CliRunner().invoke(app, ["monitor", str(evaluation), "--out", str(tmp_path / "mon"), "--windows", "1,2"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "mon" / "monitor.json").read_text())
    assert saved["episodes"] == 4 and saved["nominal_episodes"] == 2  # the clean ones set the thresholds
    assert [(o["colour_preset"], o["episodes"], o["laps"] + o["safe_stops"] <= o["episodes"]) for o in saved["outcomes"]] == [
        ("default", 2, True), ("shift-3", 2, True)]
    assert {"off_road_events", "fallback_fraction", "faults"} <= set(saved["outcomes"][0])
    assert {"steer_std", "abs_steer", "speed", "curvature"} <= set(saved["scores"])
    for entry in saved["scores"].values():
        assert set(entry["windows"]) == {"1", "2"}
        assert set(entry["windows"]["1"]) == {"tp", "fp", "fn", "tn", "precision", "recall", "fpr", "f3", "median_lead_s",
                                              "fp_shifted", "tn_shifted", "fpr_shifted"}
        assert np.isfinite(entry["threshold"])
    assert (tmp_path / "mon" / "monitor.md").read_text().startswith("| score |")
    assert (tmp_path / "mon" / "figures" / "window-1s.png").is_file()
    bad = CliRunner().invoke(app, ["monitor", str(evaluation), "--out", str(tmp_path / "bad"), "--threshold", "median"])
    assert bad.exit_code == 2 and "--threshold" in bad.output


def test_a_conformal_threshold_says_how_many_nominal_windows_it_needs(evaluation, tmp_path):
    result = CliRunner().invoke(app, ["monitor", str(evaluation), "--out", str(tmp_path / "mon"), "--threshold", "conformal",
                                      "--confidence", "0.9"])
    assert result.exit_code == 2
    assert "needs at least 45 nominal windows of one second, got" in result.output and "drive more nominal laps" in result.output
    assert not (tmp_path / "mon" / "monitor.json").exists()


# --------------------------------------------------------------------------- the fallback in the loop


@pytest.fixture(scope="module")
def run(evaluation):
    return evaluation.parent / "run"


def test_a_drive_config_refuses_a_fallback_without_a_monitor_and_unknown_scores():
    from nsacdrive.eval.closed_loop import DriveConfig

    with pytest.raises(ValueError, match="needs a monitor"):
        DriveConfig(fallback="expert")
    with pytest.raises(ValueError, match="monitor_score"):
        DriveConfig(monitor_score="luck", monitor_threshold=1.0)
    with pytest.raises(ValueError, match="go together"):
        DriveConfig(monitor_score="steer_std")
    with pytest.raises(ValueError, match="monitor_threshold must be a finite number, got nan"):
        DriveConfig(monitor_score="steer_std", monitor_threshold=float("nan"))


def test_the_live_score_is_the_offline_score_of_the_same_log(run):
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode
    from nsacdrive.eval.monitor_scores import SCORES

    drive = DriveConfig(max_steps=80, monitor_score="steer_std", monitor_threshold=1e9, monitor_smooth=7)
    record, log = run_episode(EpisodeKey(str(run), "default", 5, 0), drive)
    offline = smooth(SCORES["steer_std"][2](log).astype(np.float64), 7)
    np.testing.assert_allclose(log["monitor_score"], offline, rtol=1e-5, atol=1e-7)  # float32 log against float64
    assert record.alarms == 0 and record.fallback_fraction == 0.0


def test_the_expert_takes_over_on_every_alarm_after_the_warm_up(run):
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode

    key = EpisodeKey(str(run), "default", 5, 0)
    drive = DriveConfig(max_steps=80, monitor_score="steer_std", monitor_threshold=0.0, monitor_warmup=20, fallback="expert")
    record, log = run_episode(key, drive)
    np.testing.assert_array_equal(log["fallback"], np.r_[np.zeros(20), np.ones(len(log["fallback"]) - 20)])
    np.testing.assert_array_equal(log["executed_action"][20:], log["expert_action"][20:])  # the hand-over
    assert not np.array_equal(log["executed_action"][:20], log["expert_action"][:20])
    assert record.alarms == 1 and record.fallback_fraction == pytest.approx(60 / 80)


def test_slow_cuts_the_gas_and_the_fallback_outlasts_the_alarm(run):
    from nsacdrive.eval.closed_loop import SLOW_BRAKE, SLOW_GAS, DriveConfig, EpisodeKey, run_episode

    drive = DriveConfig(max_steps=120, monitor_score="steer_std", monitor_threshold=0.0, monitor_warmup=30, fallback="slow",
                        fallback_speed=5.0)
    _, log = run_episode(EpisodeKey(str(run), "default", 5, 0), drive)
    active = log["fallback"] > 0
    fast = log["speed"] > 5.0
    executed = log["executed_action"]
    assert np.all(executed[active & fast, 1] == 0) and np.all(executed[active & fast, 2] >= SLOW_BRAKE)
    assert np.all(executed[active & ~fast, 1] <= SLOW_GAS + 1e-7)
    one_alarm = DriveConfig(max_steps=120, monitor_score="speed", monitor_threshold=1e9, fallback="slow")
    _, quiet = run_episode(EpisodeKey(str(run), "default", 5, 0), one_alarm)
    assert not quiet["fallback"].any()


@pytest.mark.parametrize(("release", "clear_steps", "latch", "expected"), [
    # the trace below alarms once (1.2 > 1.0, at step 9); 1.0 itself is no alarm
    (1.0, 2, False, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]),
    (0.5, 2, False, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]),
    (1.0, 1, False, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]),
    (1.0, 2, True, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]),
])
def test_the_hand_back_waits_for_the_score_to_stay_clear(release, clear_steps, latch, expected):
    from nsacdrive.eval.hand_back import HandBack

    scores = [1.0, 0.2, 0.9, 0.9, 0.7, 0.4, 0.4, 0.4, 0.9, 1.2, 0.3, 0.3]
    switch = HandBack(clear_steps, release, latch)
    assert [int(switch.update(s, s > 1.0)) for s in scores] == expected


def test_hysteresis_keeps_the_fallback_until_the_score_falls_below_the_release_level():
    from nsacdrive.eval.hand_back import HandBack

    scores = [1.5, 0.9, 0.8, 0.6, 0.4, 0.55, 0.3, 0.2, 0.9]
    plain, hysteresis = HandBack(2, 1.0), HandBack(2, 0.5)
    assert [int(plain.update(s, s > 1.0)) for s in scores] == [1, 1, 0, 0, 0, 0, 0, 0, 0]
    # at or below 0.5 twice in a row only at 0.3, 0.2 (0.55 resets the count): handed back at the second
    assert [int(hysteresis.update(s, s > 1.0)) for s in scores] == [1, 1, 1, 1, 1, 1, 1, 0, 0]


def test_stop_brakes_to_a_standstill_on_the_road_while_the_controller_steers(run):
    from nsacdrive.eval.closed_loop import SAFE_STOP, STOP_BRAKE, STOP_SPEED, DriveConfig, EpisodeKey, aggregate, run_episode

    drive = DriveConfig(max_steps=600, monitor_score="steer_std", monitor_threshold=0.0, monitor_warmup=150, fallback="stop")
    record, log = run_episode(EpisodeKey(str(run), "default", 5, 0), drive)
    active = log["fallback"] > 0
    assert not active[:150].any() and active[150:].all()  # latched from the first alarm on: never handed back
    executed = log["executed_action"]
    np.testing.assert_array_equal(executed[150:, 1], 0.0)
    np.testing.assert_array_equal(executed[150:, 2], np.float32(STOP_BRAKE))
    np.testing.assert_array_equal(executed[150:, 0], np.clip(log["raw_action"][150:, 0], -1, 1))  # the controller steers
    assert record.reason == SAFE_STOP and not record.lap_finished and record.steps < 600
    assert record.off_road_events == 0 and log["speed"][-1] < 2 * STOP_SPEED
    row, = aggregate([{**record.__dict__, "driving_score": record.driving_score, "episode_id": "x"}])
    assert row["safe_stops"] == 1 and row["laps"] == 0


# --------------------------------------------------------------------------- the learned failure predictor in the loop


def _predictor(scores=("steer_std", "speed"), bias=-3.0):
    from nsacdrive.eval.predictor_features import FEATURES, FailurePredictor

    width = len(scores) * len(FEATURES)
    rng = np.random.default_rng(7)
    return FailurePredictor(scores, centre=tuple(rng.normal(0, 1, width)), scale=tuple(rng.uniform(0.5, 2.0, width)),
                            weights=tuple(rng.normal(0, 1, width)), bias=bias, horizon_s=3.0)


def test_the_live_predictor_logs_what_the_offline_judge_computes(run):
    """Driven in the loop, the predictor's log-odds at every step equal the offline judge's on the saved log,
    up to the float32 rounding of the logged inputs."""
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode
    from nsacdrive.eval.failure_predictor import episode_features, predictor_score
    from nsacdrive.eval.monitor import EpisodeScores
    from nsacdrive.eval.monitor_scores import SCORES, smooth

    predictor = _predictor()
    drive = DriveConfig(max_steps=220, monitor_score="failure_predictor", monitor_threshold=1e9, monitor_predictor=predictor)
    _, log = run_episode(EpisodeKey(str(run), "default", 5, 0), drive)
    scores = {name: smooth(np.asarray(SCORES[name][2](log), dtype=np.float64), drive.monitor_smooth) for name in predictor.scores}
    steps = len(log["speed"])
    episode = EpisodeScores("x", True, [], scores, np.zeros(steps), np.ones(steps, bool), drive.monitor_warmup)
    offline = predictor_score(predictor, episode)
    features = episode_features(episode, predictor.scores)
    eps32 = np.finfo(np.float32).eps
    # each feature carries the inputs' float32 rounding; the logged log-odds is rounded to float32 once more
    bound = 16 * eps32 * (np.abs(features) + 1) / np.asarray(predictor.scale) @ np.abs(predictor.weights) + eps32 * np.abs(offline)
    assert steps > 200 and np.all(np.abs(log["monitor_score"] - offline) <= bound)


def test_a_drive_config_keeps_its_predictor_through_json():
    from nsacdrive.common.resume import plain
    from nsacdrive.eval.closed_loop import DriveConfig

    drive = DriveConfig(monitor_score="failure_predictor", monitor_threshold=0.5, monitor_predictor=_predictor())
    assert DriveConfig(**plain(drive)) == drive
    with pytest.raises(ValueError, match="goes with monitor_score 'failure_predictor'"):
        DriveConfig(monitor_score="steer_std", monitor_threshold=0.5, monitor_predictor=_predictor())
    with pytest.raises(ValueError, match="goes with monitor_score 'failure_predictor'"):
        DriveConfig(monitor_score="failure_predictor", monitor_threshold=0.5)
    saved = plain(_predictor())
    for field, value, message in (("weights", saved["weights"][:-1], "weights: expected 12 finite numbers"),
                                  ("bias", float("nan"), "bias: expected a finite number"),
                                  ("scores", ["curvature", "speed"], "non-privileged"),
                                  ("scale", [0.0] * 12, "scale must be > 0")):
        with pytest.raises(ValueError, match=message):
            DriveConfig(monitor_score="failure_predictor", monitor_threshold=0.5, monitor_predictor={**saved, field: value})


def test_eval_drives_with_a_protocol_folders_predictor(run, tmp_path):
    """A ``nsacdrive protocol`` folder is a monitor folder: its development-family fit drives the fallback."""
    from nsacdrive.common.resume import plain

    protocol = tmp_path / "protocol"
    protocol.mkdir()
    config = {"smooth_steps": 10, "warmup_steps": 50}
    predictor = plain(_predictor(bias=50.0))  # alarms from the first step allowed
    (protocol / "protocol.json").write_text(json.dumps({"config": {"monitor": config},
                                                        "split": {"thresholds": {"failure_predictor": 0.0, "speed": 1e6},
                                                                  "predictor": predictor}}))
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", str(run), "--seeds", "5", "--max-steps", "300", "--monitor", str(protocol),
                                      "--monitor-score", "failure_predictor", "--fallback", "stop", "--workers", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(next((out / "episodes").glob("*.json")).read_text())
    assert record["reason"] == "safe_stop"
    (protocol / "protocol.json").write_text(json.dumps({"config": {"monitor": config},
                                                        "split": {"thresholds": {"failure_predictor": 0.0},
                                                                  "predictor": {**predictor, "clip": -1.0}}}))
    bad = CliRunner().invoke(app, ["eval", str(run), "--seeds", "5", "--monitor", str(protocol), "--monitor-score",
                                   "failure_predictor", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "split.predictor" in bad.output


def test_the_protocols_fallbacks_are_driven_on_the_test_families_and_judged_against_unguarded_drives(run, tmp_path):
    from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop
    from nsacdrive.eval.protocol_config import ProtocolConfig, ProtocolTracks
    from nsacdrive.eval.safety_protocol import drive_fallbacks, judge_fallbacks

    config = ProtocolConfig(development=("fog",), test=("glare",), severities=(5,), monitor=MonitorConfig(threshold="window-rate"))
    tracks = ProtocolTracks(train=(0,), fit=(1,), check=(2,), test=(5,))
    drive = DriveConfig(max_steps=300)
    evaluate_closed_loop(EvalConfig(runs=(str(run),), seeds=(5,), corruptions=("none", "glare-5"), drive=drive),
                         tmp_path / "test-corrupted", progress=False)
    split = {"selected": "steer_std", "thresholds": {"steer_std": 0.0}, "hand_back": {"clear_steps": 5}}  # alarms as soon as the warm-up is over
    drive_fallbacks(str(run), tracks, config, split, ["stop"], tmp_path, drive=drive, progress=False)
    assert (tmp_path / "guarded-stop-corrupted" / "episodes").is_dir() and not (tmp_path / "guarded-stop-colours").exists()
    judged = judge_fallbacks(tmp_path, config, ["stop"])["stop"]
    glare = judged["families"]["glare"]
    assert glare["episodes"] == 1 and glare["safe_stops"] == 1 and glare["laps"] == 0
    nominal = judged["nominal"]  # stopped from the end of the warm-up: a few steps under the fallback, then a safe stop
    assert nominal["episodes"] == 1 and nominal["laps"] == 0 and 0 < nominal["fallback_fraction"] < 1
    assert nominal["lap_time_ratio"] is None  # no lap in 300 steps: no lap time to compare


# --------------------------------------------------------------------------- the cascade


def test_a_cascade_drives_while_the_alarm_lasts_on_the_history_it_missed(run):
    """The same deterministic controller as its own cascade: engaged at the end of the warm-up, it replays the
    frames it missed, so its actions are exactly the controller's own clipped means."""
    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episode

    drive = DriveConfig(max_steps=200, monitor_score="steer_std", monitor_threshold=0.0, monitor_warmup=60, fallback="cascade",
                        fallback_run=str(run))
    record, log = run_episode(EpisodeKey(str(run), "default", 5, 0), drive)
    active = log["fallback"] > 0
    assert not active[:60].any() and active[60:].all() and not record.failed
    np.testing.assert_array_equal(log["executed_action"][60:], np.clip(log["raw_action"][60:], [-1, 0, 0], [1, 1, 1]))
    assert record.fallback_fraction == pytest.approx((len(active) - 60) / len(active))


def test_the_cascade_costs_the_steps_under_the_fallback_and_a_replay_per_engagement(run):
    from nsacdrive.eval.cascade_cost import cascade_history, cascade_share

    records = [{"steps": 100, "fallback_fraction": 0.15, "alarms": 2},  # 15 steps under it, two engagements
               {"steps": 10, "fallback_fraction": 1.0, "alarms": 1}]  # never more than every step
    assert cascade_share(records, history=7) == pytest.approx((15 + 2 * 6 + 10) / 110)
    assert cascade_share([], history=7) is None
    assert cascade_history(run) == 7  # the fixture's four frames, every second one


def test_a_cascade_needs_its_run_and_the_command_checks_it(run, tmp_path):
    from nsacdrive.eval.closed_loop import DriveConfig

    with pytest.raises(ValueError, match="fallback_run goes with fallback 'cascade'"):
        DriveConfig(monitor_score="steer_std", monitor_threshold=1.0, fallback="cascade")
    with pytest.raises(ValueError, match="fallback_run goes with fallback 'cascade'"):
        DriveConfig(monitor_score="steer_std", monitor_threshold=1.0, fallback="stop", fallback_run=str(run))
    monitor = tmp_path / "monitor"
    monitor.mkdir()
    (monitor / "monitor.json").write_text(json.dumps({"config": {"smooth_steps": 10, "warmup_steps": 50},
                                                      "scores": {"steer_std": {"threshold": 1.0}}}))
    for fallback, message in (("cascade:" + str(tmp_path / "nowhere"), "cannot load run"), ("cascade", "cascade:RUN"),
                              ("slow:x", "cascade:RUN")):
        result = CliRunner().invoke(app, ["eval", str(run), "--seeds", "5", "--monitor", str(monitor), "--monitor-score",
                                          "steer_std", "--fallback", fallback, "--out", str(tmp_path / "eval")])
        assert result.exit_code == 2 and message in result.output, result.output
