"""Faults of training runs and run folders: diverged losses, overlapping splits, interrupted saves,
corrupt weights and version records — each must stop with an error that names its cause."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from data_fixtures import synthetic_arrays, synthetic_metadata, write_synthetic

from nsacdrive.controllers import checkpoint
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.training import TrainConfig, Trainer, TrainingDiverged
from nsacdrive.data_collection.episode import EpisodeFileError, write_episode

TINY_MODEL = ModelConfig(model="gmle", encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4)


@pytest.fixture
def tiny_data(tmp_path) -> Path:
    """Three untextured synthetic episodes of 120 steps on track seeds 0, 1, 2 (no env needed)."""
    for seed in range(3):
        write_synthetic(tmp_path / "data", f"ep{seed}", 120, track_seed=seed, textured=False)
    return tmp_path / "data"


def tiny_config(data: Path, **overrides: Any) -> TrainConfig:
    base = dict(data=str(data), model=TINY_MODEL, train_seeds="0", val_seeds="1", test_seeds="2", batch_size=8, epochs=2,
                max_batches_per_epoch=3, max_val_batches=1,
                device="cpu")  # resumed runs are compared bit for bit: a CPU claim (CUDA: tests/test_accelerator.py)
    return TrainConfig(**{**base, **overrides})


def test_a_diverging_loss_stops_training_naming_the_epoch_batch_and_episodes(tiny_data, tmp_path):
    with pytest.raises(TrainingDiverged, match=r"epoch 1, training batch \d+: the loss is nan") as caught:
        Trainer(tiny_config(tiny_data, lr=1e6), tmp_path / "run", progress=False).fit()
    assert str(tiny_data / "ep0.json") in str(caught.value) and "track seed 0" in str(caught.value)
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_train_command_exits_2_with_one_error_line_when_the_loss_diverges(tiny_data, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    settings = tiny_config(tiny_data, lr=1e6).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(settings))
    result = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "run"),
                                      "--device", "cpu"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the loss is nan" in errors[0] and "best validation loss" not in result.output


def test_an_episode_with_a_nan_speed_is_rejected_at_load_naming_the_file_and_step(tiny_data, tmp_path):
    arrays = synthetic_arrays(120, seed=0, textured=False)
    arrays["speed"][57] = np.nan
    write_episode(tiny_data, "nan-speed", arrays, synthetic_metadata(arrays, track_seed=0))
    with pytest.raises(EpisodeFileError, match=r"nan-speed\.npz: array 'speed' holds NaN/inf \(first at step 57\)"):
        Trainer(tiny_config(tiny_data, model=dataclasses.replace(TINY_MODEL, speed_input=True)), tmp_path / "run", progress=False)


def test_a_nan_validation_loss_stops_training_naming_the_validation_batch(tiny_data, tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(tiny_data), tmp_path / "run", progress=False)
    training_loss = trainer.model.training_loss

    def nan_in_eval_mode(*args, **kwargs):
        terms = training_loss(*args, **kwargs)
        return terms if trainer.model.training else {**terms, "total": terms["total"] * float("nan")}

    monkeypatch.setattr(trainer.model, "training_loss", nan_in_eval_mode)
    with pytest.raises(TrainingDiverged, match=r"epoch 1, validation batch 1: the loss is nan.*ep1\.json \(track seed 1"):
        trainer.fit()


@pytest.mark.parametrize(("term", "message"), [
    (lambda model: torch.tensor(float("nan")), r"epoch 1, training batch 1: the loss is nan"),  # no gradient path
    (lambda model: (next(model.parameters()) * 0).abs().sqrt().sum(), r"epoch 1, training batch 1: the gradient norm is \[nan\]"),
])
def test_a_nan_training_loss_or_gradient_stops_training_naming_which(tiny_data, tmp_path, monkeypatch, term, message):
    trainer = Trainer(tiny_config(tiny_data), tmp_path / "run", progress=False)
    training_loss = trainer.model.training_loss
    before = [parameter.detach().clone() for parameter in trainer.model.parameters()]

    def with_term(*args, **kwargs):
        terms = training_loss(*args, **kwargs)
        return {**terms, "total": terms["total"] + term(trainer.model)} if trainer.model.training else terms

    monkeypatch.setattr(trainer.model, "training_loss", with_term)
    with pytest.raises(TrainingDiverged, match=rf"{message}, training stopped .*ep0\.json \(track seed 0"):
        trainer.fit()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))  # no step was taken


@pytest.mark.parametrize(("seeds", "message"), [
    (("0-3", "3", "4"), "train_seeds and val_seeds share track seeds 3;"),
    (("0-3", "4", "0"), "train_seeds and test_seeds share track seeds 0;"),
    (("0-1", "2-4", "4-5"), "val_seeds and test_seeds share track seeds 4;"),
])
def test_overlapping_seed_splits_are_rejected_naming_both_fields_and_the_shared_seeds(seeds, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="d", train_seeds=seeds[0], val_seeds=seeds[1], test_seeds=seeds[2])


def test_an_unknown_train_preset_is_rejected_naming_the_field_and_the_known_presets():
    with pytest.raises(ValueError, match=r"train_presets: unknown colour preset 'shift3'; expected one of default, shift-1"):
        TrainConfig(data="d", train_presets=("default", "shift3"))


def test_evaluate_offline_refuses_a_run_whose_test_seeds_are_training_tracks(tiny_data, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    Trainer(tiny_config(tiny_data, epochs=1, max_batches_per_epoch=1), tmp_path / "run", progress=False).fit()
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps({**config, "train_seeds": "0,2", "test_seeds": "0"}))
    result = CliRunner().invoke(app, ["evaluate-offline", str(tmp_path / "run"), "--data", str(tiny_data), "--out", str(tmp_path / "t")])
    assert result.exit_code == 2
    assert "config.json: not a valid training config (seed split: train_seeds and test_seeds share track seeds 0;" in result.output


# ----------------------------------------------------------------------------- interrupted saves


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (BaseException, so no `except Exception` catches it)."""


def kill_at(monkeypatch, condition) -> None:
    """Make the checkpoint module's file writes die when ``condition(path)`` holds — after writing the
    bytes when the path is the run's published model (the kill between a file and its checksum record)."""
    original = checkpoint.atomic_write_bytes

    def atomic_write_bytes(path, data):
        if condition(Path(path)):
            if Path(path).name == checkpoint.WEIGHTS_FILE:
                original(path, data)
            raise Killed
        original(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", atomic_write_bytes)


def weights_of(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(path)


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights_of(a), weights_of(b)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture
def straight(tiny_data, tmp_path) -> Path:
    """An uninterrupted 3-epoch run to compare resumed runs with."""
    Trainer(tiny_config(tiny_data, epochs=3, early_stopping_patience=10), tmp_path / "straight", progress=False).fit()
    return tmp_path / "straight"


def resume_after_kill(tiny_data, run: Path, monkeypatch, condition) -> None:
    config = tiny_config(tiny_data, epochs=3, early_stopping_patience=10)
    kill_at(monkeypatch, condition)
    with pytest.raises(Killed):
        Trainer(config, run, progress=False).fit()
    monkeypatch.undo()
    Trainer(config, run, progress=False).fit(resume=True)


@pytest.mark.parametrize(("epoch", "file"), [(1, "last.safetensors"), (1, "state.json"), (2, "best.safetensors"), (3, "state.safetensors")])
def test_a_kill_while_a_checkpoint_is_written_resumes_from_the_last_complete_one(tiny_data, tmp_path, monkeypatch, straight, epoch, file):
    run = tmp_path / "run"
    resume_after_kill(tiny_data, run, monkeypatch, lambda p: p.name == file and p.parent.name.startswith(f".epoch-{epoch:04d}."))
    assert_same_weights(checkpoint.latest_checkpoint(run).path("last.safetensors"), checkpoint.latest_checkpoint(straight).path("last.safetensors"))
    assert_same_weights(run / "model.safetensors", straight / "model.safetensors")
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == [1, 2, 3]
    assert [p.name for p in (run / "resume").iterdir()] == ["epoch-0003"]  # the unfinished write is cleaned up


def test_a_kill_between_the_published_weights_and_their_checksum_is_named_on_load_and_repaired_by_resume(
        tiny_data, tmp_path, monkeypatch, straight):
    from nsacdrive.controllers.run import load_run

    run = tmp_path / "run"
    config = tiny_config(tiny_data, epochs=3, early_stopping_patience=10)
    Trainer(config, run, progress=False).fit()
    (run / "model.safetensors").write_bytes(b"\0" + (run / "model.safetensors").read_bytes()[1:])  # stale or torn publication
    with pytest.raises(checkpoint.CheckpointError, match=r"model\.safetensors: sha256 .* differs .* repaired by `train --resume`"):
        load_run(run)
    Trainer(config, run, progress=False).fit(resume=True)
    load_run(run)
    assert_same_weights(run / "model.safetensors", straight / "model.safetensors")


def test_a_kill_in_the_first_publication_resumes_instead_of_refusing(tiny_data, tmp_path, monkeypatch, straight):
    """The published fault: best weights written, resume state not, and --resume said 'pass --resume'."""
    run = tmp_path / "run"
    resume_after_kill(tiny_data, run, monkeypatch, lambda p: p == run / "model.safetensors")
    assert_same_weights(run / "model.safetensors", straight / "model.safetensors")


def test_a_corrupt_checkpoint_file_is_named_on_resume(tiny_data, tmp_path):
    run = tmp_path / "run"
    config = tiny_config(tiny_data, epochs=1)
    Trainer(config, run, progress=False).fit()
    state = run / "resume" / "epoch-0001" / "state.safetensors"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=r"epoch-0001/state\.safetensors: sha256 .* differs"):
        Trainer(config, run, progress=False).fit(resume=True)


def test_resume_without_a_complete_checkpoint_but_with_weights_says_what_is_wrong(tiny_data, tmp_path):
    run = tmp_path / "run"
    config = tiny_config(tiny_data, epochs=1)
    Trainer(config, run, progress=False).fit()
    shutil.rmtree(run / "resume")
    with pytest.raises(checkpoint.CheckpointError, match="found model.safetensors but no complete checkpoint in resume/"):
        Trainer(config, run, progress=False).fit(resume=True)
    with pytest.raises(FileExistsError, match="already holds a run; pass --resume"):
        Trainer(config, run, progress=False).fit()


# ----------------------------------------------------------------------------- checkpoint reads and writes


@pytest.fixture
def hashed(monkeypatch) -> list[int]:
    """The sizes of the byte strings fed to sha256 from now on (hashing done once shows as one entry per file)."""
    sizes: list[int] = []
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self._digest = real(data)
            sizes.append(len(data))

        def update(self, data: bytes) -> None:
            self._digest.update(data)
            sizes[-1] += len(data)

        def hexdigest(self) -> str:
            return self._digest.hexdigest()

    monkeypatch.setattr(hashlib, "sha256", Counting)
    return sizes


def test_a_checkpoint_records_every_file_in_one_checksums_json_write(tmp_path, monkeypatch):
    written = []
    original = checkpoint.atomic_write_json
    monkeypatch.setattr(checkpoint, "atomic_write_json", lambda path, obj: (written.append(Path(path).name), original(path, obj)))
    files = {name: name.encode() * (index + 1) for index, name in enumerate(checkpoint.Checkpoint.FILES)}
    umask = os.umask(0o022)
    os.umask(umask)
    saved = checkpoint.write_checkpoint(tmp_path, 7, files)
    assert written == ["checksums.json"]
    assert saved.folder == tmp_path / "resume" / "epoch-0007" and sorted(p.name for p in (tmp_path / "resume").iterdir()) == ["epoch-0007"]
    assert json.loads((saved.folder / "checksums.json").read_text()) == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert saved.read_all() == files
    assert saved.folder.stat().st_mode & 0o777 == 0o777 & ~umask


def test_resume_reads_and_hashes_each_file_once(tiny_data, tmp_path, hashed):
    run = tmp_path / "run"
    config = tiny_config(tiny_data, epochs=1)
    Trainer(config, run, progress=False).fit()
    files = [*(p for p in checkpoint.latest_checkpoint(run).folder.iterdir() if p.name != "checksums.json"), run / "model.safetensors"]
    trainer = Trainer(config, run, progress=False)
    hashed.clear()
    trainer.fit(resume=True)  # nothing left to train: verifies, loads and republishes
    assert sorted(hashed) == sorted(path.stat().st_size for path in files) and len(files) == 5


@pytest.mark.parametrize("improved", [True, False])
def test_an_epoch_hashes_its_checkpoint_once_and_its_best_weights_once_more(tiny_data, tmp_path, monkeypatch, hashed, improved):
    """Improved: the new best is read back once to publish it. Not improved: the previous best is read once
    to carry it forward, and the published file is hashed to confirm that it needs no rewrite."""
    trainer = Trainer(tiny_config(tiny_data), tmp_path / "run", progress=False)
    trainer.fit()  # two epochs
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1.0)  # this epoch's weights differ from the published best
    trainer.state.epoch += 1
    written = []
    original = checkpoint.atomic_write_bytes
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", lambda path, data: (written.append(Path(path).name), original(path, data)))
    hashed.clear()
    trainer.save_checkpoint(improved)
    saved = checkpoint.latest_checkpoint(tmp_path / "run")
    size = {name: saved.path(name).stat().st_size for name in saved.FILES}
    assert sorted(hashed) == sorted([*size.values(), size[checkpoint.BEST_WEIGHTS]] + ([] if improved else [size[checkpoint.BEST_WEIGHTS]]))
    assert sorted(written) == sorted([*saved.FILES] + (["model.safetensors"] if improved else []))
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == saved.read(checkpoint.BEST_WEIGHTS)


# ----------------------------------------------------------------------------- corrupt weights


def test_a_flipped_byte_in_the_weights_is_named_on_load(tiny_data, tmp_path):
    from nsacdrive.controllers.run import load_run

    run = tmp_path / "run"
    Trainer(tiny_config(tiny_data, epochs=1), run, progress=False).fit()
    recorded = json.loads((run / "checksums.json").read_text())
    assert set(recorded) == {"model.safetensors"} and len(recorded["model.safetensors"]) == 64
    load_run(run)
    weights = bytearray((run / "model.safetensors").read_bytes())
    weights[-5] ^= 0x10  # inside the last tensor's data: still a readable safetensors file
    (run / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(checkpoint.CheckpointError, match=rf"{re.escape(str(run / 'model.safetensors'))}: sha256 .* differs from"):
        load_run(run)
    (run / "checksums.json").unlink()  # without the record the flip would pass unseen: refused instead
    with pytest.raises(checkpoint.CheckpointError, match=rf"{re.escape(str(run / 'model.safetensors'))}: no sha256 recorded"):
        load_run(run)


# ----------------------------------------------------------------------------- versions


@pytest.fixture
def tiny_run(tiny_data, tmp_path) -> Path:
    Trainer(tiny_config(tiny_data, epochs=1, max_batches_per_epoch=1), tmp_path / "run", progress=False).fit()
    return tmp_path / "run"


def test_a_run_folder_records_the_versions_it_was_made_with(tiny_run):
    import importlib.metadata
    import platform

    recorded = json.loads((tiny_run / "versions.json").read_text())
    assert set(recorded) == {"nsacdrive", "torch", "gymnasium", "numpy", "python", "git_commit"}
    assert all(recorded[name] == importlib.metadata.version(name) for name in ("nsacdrive", "torch", "gymnasium", "numpy"))
    assert recorded["python"] == platform.python_version()
    assert recorded["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40,64}", recorded["git_commit"])


@pytest.mark.parametrize(("package", "made_with"), [("nsacdrive", "99.0.0"), ("torch", "1.13.1")])
def test_loading_a_run_made_under_another_major_version_warns_with_both_versions(tiny_run, package, made_with):
    import importlib.metadata

    from nsacdrive.common.versions import VersionWarning
    from nsacdrive.controllers.run import load_run

    recorded = json.loads((tiny_run / "versions.json").read_text())
    (tiny_run / "versions.json").write_text(json.dumps({**recorded, package: made_with}))
    running = importlib.metadata.version(package)
    with pytest.warns(VersionWarning, match=rf"made with {package} {re.escape(made_with)}, now running {package} {re.escape(running)}"):
        load_run(tiny_run)


def test_loading_a_run_of_the_same_major_versions_or_without_a_record_is_silent(tiny_run):
    import warnings

    from nsacdrive.controllers.run import load_run

    recorded = json.loads((tiny_run / "versions.json").read_text())
    (tiny_run / "versions.json").write_text(json.dumps({**recorded, "torch": recorded["torch"].split(".")[0] + ".0.0", "numpy": "1.0"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run(tiny_run)
        (tiny_run / "versions.json").unlink()
        load_run(tiny_run)


def test_offline_tables_closed_loop_aggregates_and_dataset_manifests_record_versions(tiny_run, tiny_data, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app
    from nsacdrive.common.versions import current_versions
    from nsacdrive.data_collection.manifest import build_manifest
    from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop

    result = CliRunner().invoke(app, ["evaluate-offline", str(tiny_run), "--data", str(tiny_data), "--out", str(tmp_path / "offline")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "offline" / "versions.json").read_text()) == current_versions()
    evaluate_closed_loop(EvalConfig(runs=[tiny_run], seeds=[3], drive=DriveConfig(max_steps=10)), tmp_path / "eval", progress=False)
    assert json.loads((tmp_path / "eval" / "versions.json").read_text()) == current_versions()
    assert build_manifest(tiny_data)["versions"] == current_versions()
