"""Training and closed-loop control on an accelerator, and the device plumbing that gets them there.

The CUDA tests run where a GPU is present and are skipped, saying so, everywhere else (CI has
none). The device-independent pieces they rely on are tested on the CPU: draws follow their
generator, predictions come back to the CPU, a recorded GPU evaluation re-drives on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from run_fixtures import tiny_run
from safetensors.torch import load_file
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.common.devices import TORCH_DEVICE_TYPES, check_device_name, is_torch_device
from nsacdrive.controllers.noise import randn_like_on
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.controllers.run import load_run, read_run_config
from nsacdrive.controllers.training import Trainer
from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, run_episodes
from nsacdrive.eval.driver import ControllerPolicy
from nsacdrive.eval.results import drive_config

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (the accelerator tests run where one is)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("accelerator"), model="nsac", batches=2)


def test_draws_follow_their_generator_not_the_tensor():
    like = torch.zeros(2, dtype=torch.float64)
    first = randn_like_on((3, 4), torch.Generator().manual_seed(5), like)
    assert first.dtype == torch.float64 and first.device == like.device
    torch.testing.assert_close(first, torch.randn((3, 4), generator=torch.Generator().manual_seed(5), dtype=torch.float64), rtol=0, atol=0)


def test_a_prediction_moves_every_tensor():
    prediction = UncertainPrediction(mean=torch.zeros(2, 3), aleatoric=torch.ones(2, 3), epistemic=torch.ones(2, 3),
                                     signals={"evidence": torch.ones(2, 3)})
    moved = prediction.to("meta")
    assert moved.mean.device.type == "meta" and moved.signals["evidence"].device.type == "meta"
    assert moved.attention is None and moved.density is None


def test_drive_config_checks_the_device():
    assert DriveConfig(device="cuda:1").device == "cuda:1"  # named, not required to exist until used
    with pytest.raises(ValueError, match="drive config device"):
        DriveConfig(device="gpu please")


def _torch_takes(name: str) -> bool:
    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


def test_the_torch_free_device_check_takes_what_torch_takes():
    with pytest.raises(RuntimeError) as refusal:
        torch.device("gpu")  # the message lists torch's device types
    listed = re.search(r"Expected one of (.+) device type", str(refusal.value))
    assert listed is not None and sorted(listed.group(1).split(", ")) == sorted(TORCH_DEVICE_TYPES)
    for name in ("cpu", "cuda", "cuda:0", "cuda:1", "cuda:12", "cpu:0", "mps", "meta", "cuda:01", "cuda:-1", "cuda:+1", "cuda:",
                 " cuda", "cuda ", "CUDA", "gpu", "cuda:1:2", ""):
        assert is_torch_device(name) == _torch_takes(name), name


def test_a_device_name_is_refused_naming_its_field():
    check_device_name("auto", "training config device")
    check_device_name("cuda:1", "drive config device", allow_auto=False)
    with pytest.raises(ValueError, match=r"drive config device: expected a torch device .* got 'auto'"):
        check_device_name("auto", "drive config device", allow_auto=False)
    with pytest.raises(ValueError, match=r"--device: expected auto or a torch device .* got 'gpu'"):
        check_device_name("gpu", "--device")


def test_a_gpu_evaluation_re_drives_on_a_machine_without_one(tmp_path):
    (tmp_path / "aggregates.json").write_text(json.dumps({**dataclasses.asdict(DriveConfig(device="cuda")), "aggregates": []}))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert drive_config(tmp_path).device == expected


@cuda
def test_training_on_cuda_gives_a_run_that_loads_anywhere(run, tmp_path):
    config = dataclasses.replace(read_run_config(run), device="cuda")
    state = Trainer(config, tmp_path / "gpu", progress=False).fit()
    assert np.isfinite(state.best_val)
    model, _ = load_run(tmp_path / "gpu")  # weights saved from the GPU load on the CPU
    assert next(model.parameters()).device.type == "cpu"


@cuda
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_one_seed_gives_one_set_of_weights_on_cuda(run, tmp_path, precision):
    config = dataclasses.replace(read_run_config(run), device="cuda", max_batches_per_epoch=4, precision=precision)
    for name in ("first", "second"):
        Trainer(config, tmp_path / name, progress=False).fit()
    first, second = (load_file(tmp_path / name / "model.safetensors") for name in ("first", "second"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@cuda
@pytest.mark.parametrize("observation", ["carracing", "udacity"])
def test_nsacdrive_train_device_cuda_trains_both_cameras(tmp_path, observation):
    recipe = tiny_run(tmp_path / "recipe", model="nsac", observation=observation, batches=2)
    result = CliRunner().invoke(app, ["train", "--config", str(recipe / "config.json"), "--out", str(tmp_path / "gpu"),
                                      "--device", "cuda", "--max-batches-per-epoch", "3"])
    assert result.exit_code == 0, result.output
    assert read_run_config(tmp_path / "gpu").device == "cuda"
    history = json.loads((tmp_path / "gpu" / "history.json").read_text())
    assert history and all(np.isfinite(epoch["val_total"]) for epoch in history)
    model, _ = load_run(tmp_path / "gpu")
    assert next(model.parameters()).device.type == "cpu"


@cuda
def test_control_on_cuda_predicts_what_the_cpu_predicts(run):
    frames = np.random.default_rng(0).integers(0, 255, (3, 96, 96, 3), dtype=np.uint8)
    speeds = np.array([10.0, 20.0, 30.0], dtype=np.float32)
    predictions = {}
    for device in ("cpu", "cuda"):
        policy = ControllerPolicy(run, samples=8, device=device)
        policy.reset_episodes(3)
        generators = [torch.Generator().manual_seed(k) for k in range(3)]  # the episodes' CPU streams
        for _ in range(4):
            prediction = policy.predict_episodes([0, 1, 2], frames, speeds, generators)
        predictions[device] = prediction
    assert predictions["cuda"].mean.device.type == "cpu"  # driving loops read numpy
    for name in ("mean", "aleatoric", "epistemic"):
        torch.testing.assert_close(getattr(predictions["cuda"], name), getattr(predictions["cpu"], name), rtol=1e-3, atol=1e-5)


@cuda
def test_closed_loop_episodes_drive_on_cuda(run):
    keys = [EpisodeKey(str(run), "default", seed, 0) for seed in (5, 6)]
    results = run_episodes(keys, DriveConfig(max_steps=80, device="cuda"))
    assert [record.failed for record, _ in results] == [False, False]
    assert all(np.isfinite(log["executed_action"]).all() for _, log in results)
