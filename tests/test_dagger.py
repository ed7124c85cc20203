"""DAgger: mixture-policy rollouts, round data with expert labels, aggregation, fine-tuning, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from run_fixtures import tiny_run
from safetensors.torch import load_file

from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.rollout import drive
from nsacdrive.controllers.checkpoint import CheckpointError, load_weights
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.dataset import SequenceDataset, load_episode_records
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.recorder import CollectConfig, MixingConfig, collect
from nsacdrive.envs.car_racing import make_car_racing
from nsacdrive.eval.dagger import Dagger, DaggerConfig, round_seeds


class ConstantAgent:
    """Always brakes straight ahead: easy to tell apart from the expert."""

    source = "constant"
    needs_pixels = False
    action = np.array([0.5, 0.0, 0.3], dtype=np.float32)

    def __init__(self) -> None:
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def act(self, observation, state):
        self.calls += 1
        return self.action


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_mixture_executes_expert_with_probability_beta_and_always_labels_with_the_expert(beta):
    env = make_car_racing(render_observations=False, max_episode_steps=120)
    learner = ConstantAgent()
    steps = list(drive(env, PurePursuitExpert(), 3, learner=learner, beta=beta))
    env.close()
    labels = np.stack([s.label for s in steps])
    executed = np.stack([s.executed for s in steps])
    learner_steps = np.all(executed == ConstantAgent.action, axis=1)
    assert learner.calls == len(steps)  # the learner sees every step, in control or not
    assert not np.any(np.all(labels == ConstantAgent.action, axis=1))
    if beta == 1.0:
        assert np.array_equal(executed, labels)
    elif beta == 0.0:
        assert learner_steps.all()
    else:  # Binomial(120, 0.6) learner steps: 5 s.d. either side
        assert abs(learner_steps.mean() - (1 - beta)) < 5 * np.sqrt(beta * (1 - beta) / len(steps))
    with pytest.raises(ValueError, match="beta"):
        next(drive(env, PurePursuitExpert(), 3, learner=learner, beta=1.5))


def test_mixing_config_rejects_bad_values():
    with pytest.raises(ValueError, match="beta"):
        MixingConfig("expert", -0.1, "dagger-round-1")
    with pytest.raises(ValueError, match="plain name"):
        MixingConfig("expert", 0.5, "round/1")


def test_round_seeds_are_reproducible_distinct_and_from_the_pool():
    pool = list(range(10, 40))
    a = round_seeds(pool, 8, seed=0, round_index=1)
    assert a == round_seeds(pool, 8, seed=0, round_index=1) and len(set(a)) == 8 and set(a) <= set(pool)
    assert a != round_seeds(pool, 8, seed=0, round_index=2)
    assert round_seeds(pool, 100, seed=0, round_index=1) == pool


def test_dataset_reads_several_folders_and_names_a_missing_one(tmp_path):
    collect(CollectConfig(agent="expert", seeds=[0], max_steps=60), tmp_path / "a", progress=False)
    collect(CollectConfig(agent="expert", seeds=[1], max_steps=60), tmp_path / "b", progress=False)
    both = SequenceDataset(f"{tmp_path / 'a'},{tmp_path / 'b'}", frame_stride=1, skip_intro=0)
    assert both.track_seeds == [0, 1]
    assert len(both) == len(SequenceDataset(tmp_path / "a", skip_intro=0)) + len(SequenceDataset(tmp_path / "b", skip_intro=0))
    with pytest.raises(DatasetError, match="nowhere: dataset folder does not exist"):
        load_episode_records(f"{tmp_path / 'a'},{tmp_path / 'nowhere'}", None, "raise")


@pytest.fixture(scope="module")
def bc_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("dagger"), seeds=(0, 1, 2, 3), split=("0-1", "2", "3"), batches=2)


def test_init_from_another_architecture_is_refused_another_loss_is_not(bc_run, tmp_path):
    import dataclasses

    config = TrainConfig.from_dict(json.loads((bc_run / "config.json").read_text()))
    wider = ModelConfig.from_dict({**config.model.to_dict(), "d_model": 32})
    with pytest.raises(CheckpointError, match=r"its model differs from this run's in d_model \(16 there, 32 here\)$"):
        Trainer(dataclasses.replace(config, model=wider, init_from=str(bc_run)), tmp_path / "run", progress=False)
    beta_nll = dataclasses.replace(config.model, nll_beta=0.5)  # the loss's weighting shapes no weight
    trainer = Trainer(dataclasses.replace(config, model=beta_nll, init_from=str(bc_run)), tmp_path / "beta", progress=False)
    start, state = load_file(bc_run / "model.safetensors"), trainer.model.state_dict()
    assert start and all(torch.equal(state[name].cpu(), value) for name, value in start.items())


def test_train_init_from_starts_a_fine_tune_from_another_run(bc_run, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    out = tmp_path / "fine-tune"
    result = CliRunner().invoke(app, ["train", "--config", str(bc_run / "config.json"), "--init-from", str(bc_run),
                                      "--epochs", "1", "--max-batches-per-epoch", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["init_from"] == str(bc_run)


def test_a_dagger_round_records_expert_labels_and_fine_tunes_on_the_union(bc_run, tmp_path):
    config = DaggerConfig(init=str(bc_run), rounds=1, episodes_per_round=2, beta0=0.5, epochs_per_round=1, lr=4e-4,
                          max_steps=60, max_batches_per_epoch=2, workers=1, eval_seeds="5",
                          eval_colour_presets=("default", "shift-3"), eval_max_steps=30)
    report = Dagger(config, tmp_path, progress=False).run()
    records = load_episode_records(tmp_path / "data" / "round-1", None, "raise")
    assert len(records) == 2 and {r.sidecar["track_seed"] for r in records} <= {0, 1}
    for record in records:
        assert record.sidecar["source"] == "dagger-round-1" and record.sidecar["mixing"]["beta"] == 0.5
        assert record.sidecar["mixing"]["learner"] == f"controller:{bc_run}"
        assert record.sidecar_path.name.endswith("_dagger-round-1.json")
        # the learner drove part of the time, so executed actions and expert labels differ somewhere
        assert not np.array_equal(record.actions, record.executed_actions)
    run_config = json.loads((tmp_path / "runs" / "round-1" / "config.json").read_text())
    assert run_config["init_from"] == str(bc_run) and run_config["data"].split(",")[1] == str(tmp_path / "data" / "round-1")
    assert run_config["lr"] == 4e-4  # the round's own fine-tuning rate, not the init run's
    # fine-tuned: starts from BC weights and moves away from them
    bc, tuned = build_controller(ModelConfig.from_dict(run_config["model"])), build_controller(ModelConfig.from_dict(run_config["model"]))
    load_weights(bc, bc_run / "model.safetensors")
    load_weights(tuned, tmp_path / "runs" / "round-1" / "model.safetensors")
    assert any(not np.allclose(a.detach(), b.detach()) for a, b in zip(bc.parameters(), tuned.parameters()))
    assert {(row["round"], row["colour_preset"]) for row in report["closed_loop"]} == {(0, "default"), (0, "shift-3"), (1, "default"), (1, "shift-3")}
    assert json.loads((tmp_path / "report.json").read_text())["rounds"][0]["beta"] == 0.5

    # resume: nothing is redone; another configuration in the same folder is refused
    stamp = (tmp_path / "runs" / "round-1" / "model.safetensors").stat().st_mtime_ns
    Dagger(config, tmp_path, progress=False).run()
    assert (tmp_path / "runs" / "round-1" / "model.safetensors").stat().st_mtime_ns == stamp
    import dataclasses

    with pytest.raises(FileExistsError, match="another configuration"):
        Dagger(dataclasses.replace(config, beta0=0.9), tmp_path, progress=False).run()


def test_a_front_camera_learner_is_driven_in_the_front_camera_simulator(tmp_path):
    """A controller trained on front-camera frames collects its rounds where it can see: udacity-style,
    with the camera (field of view) it was trained on, labelled by the teacher the config names."""
    run = tiny_run(tmp_path / "bc", seeds=(0, 1, 2, 3), split=("0-1", "2", "3"), observation="udacity", camera_fov=90.0)
    config = DaggerConfig(init=str(run), expert="expert:gentle", rounds=1, episodes_per_round=1, epochs_per_round=1,
                          max_steps=40, max_batches_per_epoch=1, workers=1)
    Dagger(config, tmp_path / "dagger", progress=False).run()
    (record,) = load_episode_records(tmp_path / "dagger" / "data" / "round-1", None, "raise")
    assert (record.sidecar["frame_kind"], record.sidecar["camera_fov"]) == ("udacity", 90.0)
    assert record.sidecar_path.stem.endswith("-fov90")
    assert record.sidecar["agent_spec"] == "expert:gentle" and record.sidecar["agent"]["brake_accel"] == 30.0
    frames = np.load(record.sidecar_path.with_suffix(".npz"))["observations"]
    assert frames.shape[1:] == (160, 320, 3)


def test_dagger_config_rejects_a_non_positive_learning_rate():
    with pytest.raises(ValueError, match="lr must be > 0"):
        DaggerConfig(init="runs/x", lr=0.0)


def test_dagger_names_a_bad_teacher_spec_before_driving(bc_run, tmp_path):
    with pytest.raises(ValueError, match="unknown expert variant 'fast'"):
        Dagger(DaggerConfig(init=str(bc_run), expert="expert:fast"), tmp_path)
    assert not any(tmp_path.iterdir())


def test_dagger_refuses_round_tracks_that_overlap_held_out_ones(bc_run, tmp_path):
    with pytest.raises(ValueError, match="overlaps"):
        Dagger(DaggerConfig(init=str(bc_run), seeds="0-2"), tmp_path)
