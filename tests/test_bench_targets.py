"""`python -m bench.targets`: each saved figure against its target, the quick run marked, a missing one named."""

from __future__ import annotations

import json

import pytest

import bench.targets as targets
from bench.closed_loop_speed import one_core_per_worker_bound
from bench.common import paired_rates


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(targets, "RESULTS", tmp_path)
    return tmp_path


def by_label(start: str) -> targets.Target:
    return next(target for target in targets.TARGETS if target.label.lstrip().startswith(start))


def test_a_figure_meets_or_misses_its_target_in_the_right_direction(results):
    (results / "renderer.json").write_text(json.dumps({"speed": {"fast_share_of_render_free": 0.41},
                                                       "fidelity": {"mae_after_zoom_in": 1.2}}))
    assert targets.verdict(by_label("1. pixel env")) == ("41%", "met")  # at least 40 %
    assert targets.verdict(by_label("fidelity")) == ("1.200", "not met")  # at most 1/255
    (results / "front-camera.json").write_text(json.dumps({"env": {"udacity_style_share_of_render_free": 0.13}}))
    assert targets.verdict(by_label("front-camera env")) == ("13%", "not met")  # the same 40 % as CarRacing's pixel env


def test_the_quick_run_is_used_and_marked_when_the_full_one_is_missing(results):
    whole = {"front_camera_whole_step": {"step_seconds": [0.41, 0.29]}, "nsac_before_and_now": {"speedup": 1.7}}
    (results / "training_speed-quick.json").write_text(json.dumps(whole))
    assert targets.verdict(by_label("front-camera training")) == ("0.290 s (--quick)", "met")  # the steady epoch, at most 0.3 s
    assert targets.verdict(by_label("3. NSAC")) == ("1.70× (--quick)", "not met")
    (results / "training_speed.json").write_text(json.dumps({"nsac_before_and_now": {"speedup": 2.1}}))
    assert targets.verdict(by_label("3. NSAC")) == ("2.10×", "met")  # the full run wins
    assert targets.verdict(by_label("front-camera training")) == ("—", "not in bench/results/training_speed.json: run its script again")


def test_the_evaluator_bound_says_whether_its_target_is_within_reach(results):
    (results / "closed_loop_speed.json").write_text(json.dumps({"evaluator_share_of_two_envs": 0.22, "evaluator_two_core_bound": 0.28}))
    assert targets.verdict(by_label("2. `nsacdrive eval`")) == ("22%", "not met")
    assert targets.verdict(by_label("its bound on 2 cores")) == ("28%", "out of reach")
    (results / "closed_loop_speed.json").write_text(json.dumps({"evaluator_share_of_two_envs": 0.5, "evaluator_two_core_bound": 0.75}))
    assert targets.verdict(by_label("its bound on 2 cores")) == ("75%", "within reach")


def test_the_one_core_per_worker_bound_adds_each_steps_unavoidable_phases_to_the_env_alone():
    """4,000 steps/s alone is 250 µs a step; 500 + 100 + 150 µs more per step leave it a quarter of the
    rate. The rest of the loop (log, caches) is not in the bound."""
    phases = {"env step and frame": 900.0, "controller": 500.0, "privileged state": 100.0, "expert label": 150.0, "rest": 80.0}
    assert one_core_per_worker_bound(4000.0, phases) == pytest.approx(0.25, rel=1e-12)
    assert one_core_per_worker_bound(4000.0, {**phases, "rest": 10_000.0}) == pytest.approx(0.25, rel=1e-12)
    assert one_core_per_worker_bound(4000.0, {**phases, "controller": 0.0}) == pytest.approx(0.5, rel=1e-12)


def test_a_script_that_never_ran_is_named(results):
    assert targets.verdict(by_label("data pipeline")) == ("—", "not measured: run python -m bench.data_pipeline")
    assert targets.accelerator_row() == ("—", "not measured: run python -m bench.accelerator")


def test_the_accelerator_row_says_whether_a_gpu_ran(results):
    cpu = {"name": "CPU, 1 thread", "train_samples_per_s": 100.0}
    (results / "accelerator.json").write_text(json.dumps({"cpu": cpu, "cuda": None}))
    assert targets.accelerator_row() == ("CPU only", "not run on a GPU (none on this machine)")
    (results / "accelerator.json").write_text(json.dumps({"cpu": cpu, "cuda": {"name": "NVIDIA H200", "train_samples_per_s": 950.0}}))
    assert targets.accelerator_row() == ("950 samples/s on NVIDIA H200 (9.5× the CPU)", "run")


def test_paired_rates_take_the_median_of_each_pairs_ratio():
    """A load spike slows both sides of one pair: the paired share ignores it, a ratio of medians would not."""
    pixel, free = iter([100.0, 50.0, 100.0, 100.0]), iter([400.0, 200.0, 400.0, 300.0])
    rates = paired_rates(lambda: next(pixel), lambda: next(free), pairs=4)
    assert rates["pixel"] == 100.0 and rates["render_free"] == 350.0
    assert rates["share"] == 0.25 and rates["share_range"] == [0.25, 1 / 3] and rates["pairs"] == 4
