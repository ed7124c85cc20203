"""Training sweeps (seeds × models) as tasks: every backend gives the same weights, and they resume."""

from __future__ import annotations

import json
import sys

import pytest
from data_fixtures import normalize
from run_fixtures import TINY_MODEL
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.common.backends import ray_cluster
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.sweep import seed_sweep, train_sweep
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.data_collection.recorder import CollectConfig, collect


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep-data")
    collect(CollectConfig(agent="expert", seeds=[0, 1, 2], max_steps=80), folder, progress=False)
    return folder


def tiny(data, model: str = "gmle") -> TrainConfig:
    return TrainConfig(data=str(data), model=ModelConfig(model=model, **TINY_MODEL), train_seeds="0", val_seeds="1", test_seeds="2",
                       batch_size=8, epochs=1, max_batches_per_epoch=2, max_val_batches=1, device="cpu")  # same weights on every backend: CPU


def weights(folder) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def test_a_sweep_trains_every_model_and_seed_and_resumes(data, tmp_path):
    trainings = seed_sweep(tiny(data), [4, 5], ["gmle", "nsac"], tmp_path)
    assert [folder.name for _, folder in trainings] == ["gmle-s4", "gmle-s5", "nsac-s4", "nsac-s5"]
    assert [(config.model.model, config.seed) for config, _ in trainings] == [("gmle", 4), ("gmle", 5), ("nsac", 4), ("nsac", 5)]
    results = sorted(train_sweep(trainings, workers=2), key=lambda r: r.out)
    assert [(r.model, r.seed, r.epochs) for r in results] == [("gmle", 4, 1), ("gmle", 5, 1), ("nsac", 4, 1), ("nsac", 5, 1)]
    assert weights(tmp_path / "gmle-s4") != weights(tmp_path / "gmle-s5")  # the seed matters
    stamps = {folder: (folder / "model.safetensors").stat().st_mtime_ns for _, folder in trainings}
    again = sorted(train_sweep(trainings, workers=1), key=lambda r: r.out)  # a finished sweep returns at once
    assert again == results
    assert stamps == {folder: (folder / "model.safetensors").stat().st_mtime_ns for _, folder in trainings}
    with pytest.raises(ValueError, match="same run folder"):
        train_sweep([trainings[0], trainings[0]], workers=1)


def test_an_auto_split_is_resolved_once_for_every_training(data, tmp_path):
    auto = TrainConfig(data=str(data), model=ModelConfig(model="gmle", **TINY_MODEL))
    splits = {(config.train_seeds, config.val_seeds, config.test_seeds) for config, _ in seed_sweep(auto, [0, 1], None, tmp_path)}
    assert len(splits) == 1 and "auto" not in next(iter(splits))


def test_ray_tasks_give_the_weights_local_processes_give(data, tmp_path):
    pytest.importorskip("ray")
    trainings = {backend: seed_sweep(tiny(data, "nsac"), [7, 8], None, tmp_path / backend) for backend in ("process", "ray")}
    list(train_sweep(trainings["process"], workers=2))
    with ray_cluster(workers=2):
        results = sorted(train_sweep(trainings["ray"], workers=2, backend="ray"), key=lambda r: r.seed)
    assert [r.seed for r in results] == [7, 8]
    for seed in (7, 8):
        assert weights(tmp_path / "ray" / f"nsac-s{seed}") == weights(tmp_path / "process" / f"nsac-s{seed}")


def test_the_sweep_command_writes_its_summary_and_checks_its_arguments(data, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny(data).to_dict()))
    runner = CliRunner()
    result = runner.invoke(app, ["sweep", "--config", str(config), "--seeds", "1-2", "--precision", "bfloat16", "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["model"], r["seed"]) for r in summary["runs"]] == [("gmle", 1), ("gmle", 2)] and summary["backend"] == "process"
    assert json.loads((tmp_path / "sweep" / "gmle-s1" / "config.json").read_text())["precision"] == "bfloat16"  # the flag reaches each run
    assert "gmle seed 1: 1 epochs" in result.output
    bad = runner.invoke(app, ["sweep", "--config", str(config), "--models", "gmle,transformer", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "unknown transformer" in normalize(bad.output)
    stray = runner.invoke(app, ["sweep", "--config", str(config), "--address", "auto", "--out", str(tmp_path / "bad")])
    assert stray.exit_code == 2 and "only used with --backend ray" in normalize(stray.output)


def test_missing_ray_is_named(data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match="nsacdrive\\[ray\\]"):
        train_sweep(seed_sweep(tiny(data), [0], None, tmp_path), workers=1, backend="ray")
