"""Closed-loop evaluation: episodes, per-step logs, aggregation maths, faults, resume, pairing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from float_paths import assert_predictions_agree, path_rtol
from hypothesis import given
from hypothesis import strategies as st
from run_fixtures import tiny_run

from nsacdrive.controllers.actions import cautious_pedals
from nsacdrive.eval.closed_loop import (
    DriveConfig,
    EpisodeRecord,
    EvalConfig,
    aggregate,
    evaluate_closed_loop,
    throttle_cap,
)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("closed_loop"))


def evaluation(run, seeds=(3,), max_steps=30, **settings) -> EvalConfig:
    """A small evaluation of ``run``: ``max_steps``-step episodes on ``seeds``."""
    return EvalConfig(runs=[run], seeds=seeds, drive=DriveConfig(max_steps=max_steps), **settings)


def test_episodes_logs_and_summary(trained_run, tmp_path):
    rows = evaluate_closed_loop(evaluation(trained_run, (3, 4), 40, colour_presets=["default", "shift-3"]), tmp_path, progress=False)
    assert {(r["colour_preset"], r["episodes"], r["failed"]) for r in rows} == {("default", 2, 0), ("shift-3", 2, 0)}
    record = json.loads((tmp_path / "episodes" / "run_default_seed000003_r0.json").read_text())
    assert record["steps"] == 40 and record["reason"] == "time_limit" and not record["lap_finished"]
    log = np.load(tmp_path / "episodes" / "run_default_seed000003_r0.npz")
    for name in ("pose", "speed", "lateral_error", "heading_error", "progress", "raw_action", "executed_action", "aleatoric", "epistemic"):
        assert len(log[name]) == 40, name
    executed = log["executed_action"]
    assert np.all(executed[:, 0] >= -1) and np.all(executed[:, 0] <= 1) and np.all((executed[:, 1:] >= 0) & (executed[:, 1:] <= 1))
    assert record["mean_abs_lateral_error"] == pytest.approx(float(np.abs(log["lateral_error"]).mean()), rel=1e-5)
    assert log["expert_action"].shape == (40, 3) and log["attention"].shape == (40, 4)
    assert np.isnan(log["attention"]).all()  # a GMLE head does not attend over the frames
    assert (tmp_path / "summary.csv").read_text().count("\n") == 5


def test_same_seeds_give_identical_episodes_and_resume_skips_finished_ones(trained_run, tmp_path):
    config = evaluation(trained_run, repeats=2)
    evaluate_closed_loop(config, tmp_path / "a", progress=False)
    evaluate_closed_loop(config, tmp_path / "b", progress=False)
    a = np.load(tmp_path / "a" / "episodes" / "run_default_seed000003_r1.npz")
    b = np.load(tmp_path / "b" / "episodes" / "run_default_seed000003_r1.npz")
    assert np.array_equal(a["executed_action"], b["executed_action"])
    with pytest.raises(FileExistsError, match="--resume"):
        evaluate_closed_loop(config, tmp_path / "a", progress=False)
    finished = tmp_path / "a" / "episodes" / "run_default_seed000003_r0.json"
    stamp = finished.stat().st_mtime_ns
    (tmp_path / "a" / "episodes" / "run_default_seed000003_r1.json").unlink()  # a killed run lost this one
    evaluate_closed_loop(config, tmp_path / "a", resume=True, progress=False)
    assert finished.stat().st_mtime_ns == stamp
    assert (tmp_path / "a" / "episodes" / "run_default_seed000003_r1.json").exists()


def test_a_resumed_evaluation_removes_what_a_killed_one_left_half_written(trained_run, tmp_path):
    config = evaluation(trained_run, max_steps=20)
    evaluate_closed_loop(config, tmp_path, progress=False)
    (tmp_path / "episodes" / "run_default_seed000003_r0.json").unlink()  # killed while writing this episode …
    leftovers = [tmp_path / "episodes" / ".run_default_seed000003_r0.npz.k1ll3d.partial", tmp_path / ".summary.csv.x7.partial"]
    for leftover in leftovers:
        leftover.write_bytes(b"half")
    evaluate_closed_loop(config, tmp_path, resume=True, progress=False)
    assert not [p for p in tmp_path.rglob("*.partial")]
    assert (tmp_path / "episodes" / "run_default_seed000003_r0.json").exists()


def test_an_evaluation_that_dies_leaves_no_temporary_files(trained_run, tmp_path, monkeypatch):
    import nsacdrive.eval.closed_loop as closed_loop

    def killed_while_writing(task):
        (Path(task.out_dir) / "episodes").mkdir(parents=True, exist_ok=True)
        (Path(task.out_dir) / "episodes" / ".run_default_seed000003_r0.npz.abc.partial").write_bytes(b"half")
        raise RuntimeError("worker died")

    monkeypatch.setattr(closed_loop, "_groups_worker", killed_while_writing)
    with pytest.raises(RuntimeError, match="worker died"):
        evaluate_closed_loop(evaluation(trained_run, max_steps=20, workers=1), tmp_path, progress=False)
    assert not [p for p in tmp_path.rglob("*.partial")]


def test_a_faulty_episode_is_recorded_and_the_evaluation_goes_on(trained_run, tmp_path, monkeypatch):
    from nsacdrive.eval import driver

    original = driver.ControllerPolicy.predict_episodes

    def broken(self, episodes, observations, speeds=None, generators=None):
        prediction = original(self, episodes, observations, speeds, generators)
        prediction.mean[self.seen[episodes] >= 5] = float("nan")
        return prediction

    monkeypatch.setattr(driver.ControllerPolicy, "predict_episodes", broken)
    rows = evaluate_closed_loop(evaluation(trained_run, (3, 4), 20), tmp_path, progress=False)
    assert rows[0]["episodes"] == 2 and rows[0]["failed"] == 2
    record = json.loads((tmp_path / "episodes" / "run_default_seed000004_r0.json").read_text())
    assert record["failed"] and "non-finite action" in record["reason"]


def test_the_eval_command_says_when_a_fault_ended_episodes(trained_run, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nsacdrive.cli import app
    from nsacdrive.eval import driver

    def broken(self, episodes, observations, speeds=None, generators=None):
        raise RuntimeError("the accelerator fell off")

    monkeypatch.setattr(driver.ControllerPolicy, "predict_episodes", broken)
    result = CliRunner().invoke(app, ["eval", str(trained_run), "--seeds", "3", "--max-steps", "20", "--workers", "1",
                                      "--inference", "inline", "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    warning = result.output.strip().splitlines()[-1]
    assert warning.startswith("warning: 1 episode(s) could not be driven to the end because of a fault, not the driving (first: ")
    assert "the accelerator fell off" in warning and warning.endswith(f"every reason is in {tmp_path / 'eval' / 'summary.csv'}")


def test_aggregation_maths_on_known_records():
    def record(repeat, lap, score, lateral=1.0, failed=False, completion=1.0, events=0, reason="lap_finished"):
        r = EpisodeRecord("runs/x", "nsac", "default", 0, repeat, failed, reason, steps=10, score=score, lap_finished=lap,
                          route_completion=completion, mean_abs_lateral_error=lateral, off_road_events=events)
        return {**r.__dict__, "driving_score": r.driving_score}

    records = [record(0, True, 910), record(0, True, 870, lateral=3.0), record(1, False, 500, completion=0.5, events=2, reason="time_limit"),
               record(1, True, 905)]
    (row,) = aggregate(records)
    assert row["success_mean"] == pytest.approx(0.75) and row["success_std"] == pytest.approx(0.25)
    assert row["score_ge_900"] == pytest.approx(0.5) and row["score_ge_860"] == pytest.approx(0.75)
    assert row["mean_abs_lateral_error"] == pytest.approx(1.5)
    assert row["driving_score"] == pytest.approx((1 + 1 + 0.5 * 0.8**2 + 1) / 4)
    left = EpisodeRecord("r", "m", "default", 0, 0, False, "left_playfield", route_completion=0.4, off_road_events=1)
    assert left.driving_score == pytest.approx(0.4 * 0.8 * 0.5)
    # two trials per run: repeats 0, 1 form run 0 (1/2 laps), repeats 2, 3 run 1 (2/2 laps)
    trials = [record(0, True, 910), record(1, False, 500), record(2, True, 905), record(3, True, 920)]
    (row,) = aggregate(trials, trials=2)
    assert row["success_mean"] == pytest.approx(0.75) and row["success_std"] == pytest.approx(0.25)
    assert aggregate(trials)[0]["success_std"] == pytest.approx(np.std([1, 0, 1, 1]))


def test_runs_times_trials_episodes_per_track(trained_run, tmp_path):
    evaluate_closed_loop(evaluation(trained_run, max_steps=10, repeats=2, trials=2), tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "episodes").glob("*.json")) == [f"run_default_seed000003_r{k}.json" for k in range(4)]
    settings = json.loads((tmp_path / "aggregates.json").read_text())
    assert (settings["repeats"], settings["trials"], settings["aggregates"][0]["episodes"]) == (2, 2, 4)
    with pytest.raises(ValueError, match="evaluation config trials must be >= 1, got 0"):
        evaluation(trained_run, trials=0)


def test_stock_renderer_episodes_and_a_bad_renderer(trained_run, tmp_path):
    stock = EvalConfig(runs=[trained_run], seeds=[3], drive=DriveConfig(max_steps=60, renderer="stock"))
    evaluate_closed_loop(stock, tmp_path / "stock", progress=False)
    evaluate_closed_loop(evaluation(trained_run, max_steps=60), tmp_path / "fast", progress=False)
    assert json.loads((tmp_path / "stock" / "aggregates.json").read_text())["renderer"] == "stock"
    stock, fast = (np.load(tmp_path / name / "episodes" / "run_default_seed000003_r0.npz") for name in ("stock", "fast"))
    assert stock["raw_action"].shape == fast["raw_action"].shape
    # frames agree to < 1/255 on average (bench/renderer.py), so the controller acts almost alike
    assert np.abs(stock["raw_action"] - fast["raw_action"]).mean() < 0.05
    with pytest.raises(ValueError, match="drive config renderer: expected one of stock, fast, got 'magic'"):
        DriveConfig(renderer="magic")


def test_a_run_listed_twice_or_two_runs_of_one_folder_name_are_refused(trained_run, tmp_path):
    with pytest.raises(ValueError, match="evaluation config run folder names: listed twice: run$"):
        EvalConfig(runs=[trained_run, Path(trained_run) / "."], seeds=[3])
    with pytest.raises(ValueError, match="evaluation config run folder names: listed twice: run$"):
        EvalConfig(runs=[tmp_path / "a" / "run", tmp_path / "b" / "run"], seeds=[3])


def test_inference_is_resolved_once_when_the_config_is_made(trained_run, tmp_path, monkeypatch):
    import dataclasses

    import nsacdrive.eval.configs as configs

    calls = []
    resolve = configs.resolve_inference
    monkeypatch.setattr(configs, "resolve_inference", lambda *args: calls.append(args) or resolve(*args))
    config = evaluation(trained_run, max_steps=10)
    evaluate_closed_loop(config, tmp_path, progress=False)
    assert calls == [("inline", "process", 1)]
    assert json.loads((tmp_path / "aggregates.json").read_text())["inference"] == config.resolved_inference == "inline"
    auto = dataclasses.replace(config, inference="auto")
    assert auto.inference == "auto" and auto.resolved_inference == resolve("auto", "process", 1)
    assert dataclasses.replace(auto, workers=10**6).resolved_inference == "inline"  # no machine has 2 million cores


def test_throttle_cap_slows_down_only_when_steering_is_uncertain():
    action = np.array([0.1, 0.8, 0.0], dtype=np.float32)
    assert np.array_equal(throttle_cap(action, 0.05, 0.1), action)
    np.testing.assert_allclose(throttle_cap(action, 0.4, 0.1), [0.1, 0.2, 0.0])
    assert np.array_equal(throttle_cap(action, 5.0, None), action)


def test_pedal_caution_moves_gas_down_and_brake_up_by_k_sigma_within_the_box():
    action, std = np.array([0.3, 0.6, 0.1], dtype=np.float32), np.array([0.5, 0.2, 0.25], dtype=np.float32)
    assert np.array_equal(cautious_pedals(action, std, None), action)
    np.testing.assert_allclose(cautious_pedals(action, std, 1.0), [0.3, 0.4, 0.35], rtol=1e-6)
    np.testing.assert_allclose(cautious_pedals(action, std, 4.0), [0.3, 0.0, 1.0])  # clipped to the box
    with pytest.raises(ValueError, match="pedal_caution must be >= 0 or None, got -1"):
        DriveConfig(pedal_caution=-1)


def test_gas_caution_gives_the_gas_its_own_k_and_zero_leaves_it_alone():
    action, std = np.array([0.3, 0.6, 0.1], dtype=np.float32), np.array([0.5, 0.2, 0.25], dtype=np.float32)
    np.testing.assert_allclose(cautious_pedals(action, std, 1.0, gas_caution=0.0), [0.3, 0.6, 0.35], rtol=1e-6)
    np.testing.assert_allclose(cautious_pedals(action, std, 1.0, gas_caution=2.0), [0.3, 0.2, 0.35], rtol=1e-6)
    assert np.array_equal(cautious_pedals(action, std, None, gas_caution=2.0), action)  # no caution at all
    with pytest.raises(ValueError, match="gas_caution must be >= 0 and goes with pedal_caution, got 0.0 with pedal_caution None"):
        DriveConfig(gas_caution=0.0)
    with pytest.raises(ValueError, match="gas_caution must be >= 0 and goes with pedal_caution, got -1"):
        DriveConfig(pedal_caution=0.5, gas_caution=-1)


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 2), st.floats(0, 2), st.floats(0, 3), st.floats(0, 3))
def test_more_caution_never_adds_gas_or_takes_brake_away(gas, brake, gas_std, brake_std, k, more):
    action, std = np.array([0.0, gas, brake]), np.array([1.0, gas_std, brake_std])
    low, high = cautious_pedals(action, std, k), cautious_pedals(action, std, k + more)
    assert high[1] <= low[1] <= gas and brake <= low[2] <= high[2]
    assert 0.0 <= high[1] and high[2] <= 1.0 and high[0] == 0.0


def test_an_evaluation_with_pedal_caution_executes_the_cautious_pedals(trained_run, tmp_path):
    config = EvalConfig(runs=[trained_run], seeds=(3,), drive=DriveConfig(max_steps=20, pedal_caution=1.5))
    evaluate_closed_loop(config, tmp_path, progress=False)
    log = np.load(tmp_path / "episodes" / "run_default_seed000003_r0.npz")
    std = np.sqrt(log["aleatoric"] + log["epistemic"])
    expected = np.stack([cautious_pedals(np.clip(mean, [-1, 0, 0], [1, 1, 1]), s, 1.5)
                         for mean, s in zip(log["raw_action"], std)])
    # the log's variances are float32 like the prediction's; sqrt of their sum agrees to float32 rounding
    np.testing.assert_allclose(log["executed_action"], expected, rtol=1e-5, atol=1e-6)
    assert np.all(log["executed_action"][:, 2] >= np.clip(log["raw_action"][:, 2], 0, 1))
    aggregates = json.loads((tmp_path / "aggregates.json").read_text())
    assert aggregates["pedal_caution"] == 1.5


def test_cached_tokens_give_the_same_prediction_as_re_encoding_the_sequence(trained_run):
    import torch

    from nsacdrive.envs.observation import preprocess_observation
    from nsacdrive.eval.driver import ControllerAgent

    agent = ControllerAgent(trained_run)
    rng = np.random.default_rng(0)
    for step in range(12):  # past the (T−1)·stride history, so the cache wraps around
        frame = rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
        cached = agent.predict(frame)
        frames = torch.from_numpy(preprocess_observation(agent.sequence()))[None]
        full = agent.model.predict(frames, agent.timestamps, samples=agent.samples)
        # one frame encoded per step vs all T at once: float32 rounding apart (tests/float_paths.py)
        tokens = frames.shape[1] * agent.model.tokens_per_frame
        assert_predictions_agree(cached, full, path_rtol(agent.model, tokens), fields=("mean", "aleatoric"))
    agent.reset()
    assert not agent.frames and agent.seen.tolist() == [0]
