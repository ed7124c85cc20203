"""Lockstep closed-loop evaluation: B episodes per controller call, each on its own random stream."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from float_paths import assert_predictions_agree, path_rtol, prediction_row
from run_fixtures import TINY_MODEL

from nsacdrive.controllers.heads import global_rng_from
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller
from nsacdrive.eval.closed_loop import (
    DriveConfig,
    EpisodeKey,
    EvalConfig,
    batch_groups,
    evaluate_closed_loop,
    run_episode,
    run_episodes,
)

TIMES = torch.tensor([[-0.06, -0.04, -0.02, 0.0]])


def _tokens(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 4, TINY_MODEL["encoder"].token_dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model", ["nsac", "mcdropout", "sdenet", "levy"])
def test_each_row_draws_from_its_own_generator(model):
    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model=model, **TINY_MODEL, levy_frames=4)).eval()
    tokens, times = _tokens(3), TIMES.expand(3, -1)

    def predict(seeds, rows=slice(None)):
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        return controller.predict_tokens(tokens[rows], times[rows], samples=8, generators=generators)

    batched = predict([10, 11, 12])
    alone = predict([11], slice(1, 2))  # row 1 on its own, same stream: 1 row vs 3 rounds differently
    rtol = path_rtol(controller, tokens.shape[1])
    assert_predictions_agree(prediction_row(batched, 1), alone, rtol, fields=("mean", "epistemic"))
    other = predict([10, 99, 12])  # another stream for row 1 only
    for kept in (0, 2):
        assert_predictions_agree(prediction_row(other, kept), prediction_row(batched, kept), rtol, fields=("mean", "epistemic"))
    assert not torch.equal(other.epistemic[1], batched.epistemic[1])  # row 1's draws did change


def test_a_row_stream_is_the_global_stream_of_the_same_seed():
    """One episode on its own generator = the same episode seeded through torch.manual_seed."""
    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model="nsac", **TINY_MODEL)).eval()
    tokens = _tokens(1)
    torch.manual_seed(1234)
    global_stream = controller.predict_tokens(tokens, TIMES, samples=8)
    own = controller.predict_tokens(tokens, TIMES, samples=8, generators=[torch.Generator().manual_seed(1234)])
    assert torch.equal(global_stream.mean, own.mean) and torch.equal(global_stream.epistemic, own.epistemic)


def test_global_rng_from_swaps_and_hands_back_the_state():
    generator = torch.Generator().manual_seed(5)
    expected = torch.randn(4, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with global_rng_from(generator):
        drawn = torch.randn(4)
    assert torch.equal(drawn, expected) and torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.randn(2, generator=generator), torch.randn(6, generator=torch.Generator().manual_seed(5))[4:])


def test_batch_groups_are_consecutive_keys_of_one_run():
    keys = [EpisodeKey(run, "default", seed, 0) for run in ("a", "b") for seed in range(5)]
    groups = batch_groups(keys, 3)
    assert [[k.track_seed for k in g] for g in groups] == [[0, 1, 2], [3, 4], [0, 1, 2], [3, 4]]
    assert all(len({k.run for k in g}) == 1 for g in groups)
    assert batch_groups(keys, 1) == [[k] for k in keys]


@pytest.fixture(scope="module")
def nsac_run(tmp_path_factory):
    from run_fixtures import tiny_run

    return tiny_run(tmp_path_factory.mktemp("lockstep"), model="nsac")


def test_a_group_drives_every_episode_like_its_own_loop(nsac_run):
    keys = [EpisodeKey(str(nsac_run), "default", seed, 0) for seed in (3, 4, 5)]
    grouped = run_episodes(keys, DriveConfig(max_steps=40))
    for key, (record, arrays) in zip(keys, grouped):
        single, single_arrays = run_episode(key, DriveConfig(max_steps=40))
        assert not record.failed and record.steps == single.steps == 40
        # the same episode: one network call for three rows only changes float rounding
        np.testing.assert_allclose(arrays["executed_action"], single_arrays["executed_action"], atol=1e-3)
        assert record.track_seed == key.track_seed


def test_evaluation_is_the_same_for_any_worker_count_and_records_its_group(nsac_run, tmp_path):
    config = EvalConfig(runs=[nsac_run], seeds=[3, 4, 5], drive=DriveConfig(max_steps=30), batch=2)
    evaluate_closed_loop(config, tmp_path / "one", progress=False)
    evaluate_closed_loop(dataclasses.replace(config, workers=2), tmp_path / "two", progress=False)
    for seed in (3, 4, 5):
        name = f"run_default_seed{seed:06d}_r0"
        one, two = (np.load(tmp_path / d / "episodes" / f"{name}.npz") for d in ("one", "two"))
        assert np.array_equal(one["executed_action"], two["executed_action"])
    record = json.loads((tmp_path / "one" / "episodes" / "run_default_seed000004_r0.json").read_text())
    assert record["batch_group"] == [["default", 3, 0, "none"], ["default", 4, 0, "none"]]  # preset, seed, repeat, corruption
    assert json.loads((tmp_path / "one" / "aggregates.json").read_text())["batch"] == 2
    with pytest.raises(ValueError, match="evaluation config batch must be >= 1, got 0"):
        dataclasses.replace(config, batch=0)


def test_a_udacity_observation_controller_is_evaluated_on_the_front_camera_simulator(tmp_path):
    from nsacdrive.controllers.checkpoint import WEIGHTS_FILE, save_weights, write_config
    from nsacdrive.controllers.encoders import EncoderConfig
    from nsacdrive.controllers.train_config import TrainConfig

    model = ModelConfig(model="nsac", observation="udacity", encoder=EncoderConfig(kind="nvidia", token_dim=16), d_model=16,
                        num_heads=4, topk=8, speed_input=True)
    config = TrainConfig(data="unused", model=model, sequence_length=3, frame_stride=2)
    torch.manual_seed(0)
    write_config(tmp_path / "run", config.to_dict())
    save_weights(build_controller(model), tmp_path / "run" / WEIGHTS_FILE)
    frames: list[np.ndarray] = []
    record, arrays = run_episode(EpisodeKey(str(tmp_path / "run"), "shift-3", 3, 0), DriveConfig(max_steps=25, samples=4), on_frame=lambda frame: frames.append(frame))
    assert not record.failed and record.steps == 25, record.reason
    assert frames[0].shape == (160, 320, 3) and len(frames) == 25  # the front camera, not the 96×96 top view
    assert arrays["attention"].shape == (25, 3) and np.allclose(arrays["attention"].sum(1), 1, atol=1e-4)
    with pytest.raises(ValueError, match="front-camera"):
        from nsacdrive.envs.observation_kinds import make_env_for

        make_env_for("udacity", "default", 10, renderer="stock")


def test_an_internals_recorder_stops_when_its_episode_ends_in_a_longer_group(nsac_run, monkeypatch):
    """A group predicts until its last episode ends; per-episode hooks must not record past their own end."""
    from nsacdrive.eval import driver
    from nsacdrive.eval.explain.potentials import InternalsRecorder

    original = driver.ControllerPolicy.predict_episodes

    def row_one_fails_at_its_sixth_prediction(self, episodes, observations, speeds=None, generators=None):
        prediction = original(self, episodes, observations, speeds, generators)
        if self.seen[1] == 6:
            prediction.mean[1] = float("nan")
        return prediction

    monkeypatch.setattr(driver.ControllerPolicy, "predict_episodes", row_one_fails_at_its_sixth_prediction)
    recorders = [InternalsRecorder(), InternalsRecorder()]
    keys = [EpisodeKey(str(nsac_run), "default", seed, 0) for seed in (3, 4)]
    results = run_episodes(keys, DriveConfig(max_steps=30), on_policy=lambda policy: [r.attach(policy, row) for row, r in enumerate(recorders)])
    (first, _), (second, _) = results
    assert not first.failed and first.steps == 30 and second.failed and "non-finite" in second.reason
    assert recorders[0].kind == "nsac" and len(recorders[0].rows) == 30
    assert len(recorders[1].rows) == 6  # five good steps and the faulty prediction, nothing after
