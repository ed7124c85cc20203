"""Double-buffered evaluation: the controller in its own process gives the inline loop's numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nsacdrive.eval.closed_loop import (
    DriveConfig,
    EpisodeKey,
    EvalConfig,
    episode_generator,
    evaluate_closed_loop,
    run_pipelined,
)
from nsacdrive.eval.configs import resolve_inference
from nsacdrive.eval.driver import ControllerPolicy
from nsacdrive.eval.inference import InferenceError, InferenceProcess


@pytest.fixture(scope="module")
def nsac_run(tmp_path_factory):
    from run_fixtures import tiny_run

    return tiny_run(tmp_path_factory.mktemp("inference"), model="nsac")


def _frames(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(batch, 96, 96, 3), dtype=np.uint8)


def _streams(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_two_interleaved_slots_predict_bit_for_bit_like_their_own_policies(nsac_run):
    torch.set_num_threads(1)
    inline = {slot: ControllerPolicy(nsac_run) for slot in (0, 1)}
    seeds = {0: [1, 2, 3], 1: [7, 8]}
    streams = {slot: _streams(seeds[slot]) for slot in (0, 1)}
    for slot, policy in inline.items():
        policy.reset_episodes(len(seeds[slot]))
    with InferenceProcess(nsac_run) as server:
        assert server.interface == inline[0].interface
        for slot in (0, 1):
            server.open_group(slot, _streams(seeds[slot]))
        for step in range(6):  # the token rings fill up and wrap; the streams advance
            for slot in (0, 1):
                server.submit(slot, _frames(len(seeds[slot]), 10 * step + slot), None)
            for slot in (0, 1):  # replies come back in submission order
                remote = server.collect()
                local = inline[slot].predict_episodes(np.arange(len(seeds[slot])), _frames(len(seeds[slot]), 10 * step + slot),
                                                      None, streams[slot])
                for field in ("mean", "aleatoric", "epistemic", "attention"):
                    assert torch.equal(getattr(remote, field), getattr(local, field)), (step, slot, field)


def test_a_failed_request_raises_its_reason_and_the_process_serves_on(nsac_run):
    with InferenceProcess(nsac_run) as server:
        server.open_group(0, _streams([1, 2]))
        server.submit(0, np.zeros((2, 10, 10, 3), dtype=np.uint8), None)  # not a CarRacing frame
        with pytest.raises(InferenceError, match="ValueError"):
            server.collect()
        server.submit(0, _frames(2, 0), None)
        assert server.collect().mean.shape == (2, 3)
        with pytest.raises(RuntimeError, match="already has a request in flight"):
            server.submit(0, _frames(2, 1), None)
            server.submit(0, _frames(2, 2), None)
        server.collect()
        with pytest.raises(RuntimeError, match="no request in flight"):
            server.collect()


def test_a_dead_inference_process_is_reported_not_hung(nsac_run):
    server = InferenceProcess(nsac_run)
    server.open_group(0, _streams([1]))
    server._process.kill()
    server._process.join()
    with pytest.raises(InferenceError, match="inference process exited"):
        server.submit(0, _frames(1, 0), None)
        server.collect()
    server.close()


def test_an_unloadable_run_fails_its_episodes(tmp_path):
    with pytest.raises(InferenceError, match="CheckpointError: .*missing: run folder does not exist"):
        InferenceProcess(tmp_path / "missing")
    groups = [[EpisodeKey(str(tmp_path / "missing"), "default", seed, 0)] for seed in (1, 2)]
    results = run_pipelined(groups, DriveConfig(max_steps=20))
    assert [[record.failed for record, _ in group] for group in results] == [[True], [True]]
    assert "run folder does not exist" in results[0][0][0].reason


def test_the_process_evaluation_writes_the_inline_episodes_bit_for_bit(nsac_run, tmp_path):
    """Five episodes, batch 2: three lockstep groups, driven as a pair plus a single in process mode."""
    torch.set_num_threads(1)
    for mode in ("inline", "process"):
        config = EvalConfig(runs=[nsac_run], seeds=[3, 4, 5, 6, 7], drive=DriveConfig(max_steps=30), batch=2, inference=mode)
        evaluate_closed_loop(config, tmp_path / mode, progress=False)
    for seed in (3, 4, 5, 6, 7):
        name = f"run_default_seed{seed:06d}_r0"
        inline, process = (np.load(tmp_path / mode / "episodes" / f"{name}.npz") for mode in ("inline", "process"))
        assert sorted(inline.files) == sorted(process.files) and "executed_action" in inline.files
        for field in inline.files:
            assert np.array_equal(inline[field], process[field], equal_nan=True), (seed, field)
        records = [json.loads((tmp_path / mode / "episodes" / f"{name}.json").read_text()) for mode in ("inline", "process")]
        assert records[0] == records[1] and not records[0]["failed"] and records[0]["steps"] == 30
    assert json.loads((tmp_path / "process" / "aggregates.json").read_text())["inference"] == "process"


def test_the_episode_streams_reach_the_process_as_copies(nsac_run):
    """The caller's generators are copied, not advanced: a re-drive from the same keys starts afresh."""
    key = EpisodeKey(str(nsac_run), "default", 3, 0)
    generator = episode_generator(key)
    before = generator.get_state()
    with InferenceProcess(nsac_run) as server:
        server.open_group(0, [generator])
        server.submit(0, _frames(1, 0), None)
        server.collect()
    assert torch.equal(generator.get_state(), before)


def test_auto_gives_the_controller_a_process_only_when_cores_are_spare(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    assert resolve_inference("auto", "process", 1) == "process"
    assert resolve_inference("auto", "process", 2) == "process"
    assert resolve_inference("auto", "process", 3) == "inline"
    assert resolve_inference("auto", "ray", 1) == "inline"
    assert resolve_inference("inline", "process", 1) == "inline"
    with pytest.raises(ValueError, match="inference 'process' needs backend 'process'"):
        resolve_inference("process", "ray", 1)
    with pytest.raises(ValueError, match="inference: expected one of auto, inline, process, got 'gpu'"):
        resolve_inference("gpu", "process", 1)
