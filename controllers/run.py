"""Load a trained run folder for driving or evaluation, without the trainer."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from nsacdrive.common.devices import check_device_name
from nsacdrive.common.versions import check_versions
from nsacdrive.controllers.calibration import read_calibration
from nsacdrive.controllers.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointError, load_weights, read_config
from nsacdrive.controllers.density import attach_density, read_density
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU; any other name is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def usable_device(name: str, option: str = "--device") -> torch.device:
    """The device ``name`` picks (:func:`pick_device`), checked to exist on this machine, so a job
    that cannot use it fails before any work instead of in every episode or at the first batch.

    :raises ValueError: naming ``option``, the device and what this machine has instead
    """
    check_device_name(name, option)
    device = pick_device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but no GPU answers"
            raise ValueError(f"{option} {name}: CUDA is not available on this machine (torch {torch.__version__}, {build}); "
                             "use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{option} {name}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                             f"cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise ValueError(f"{option} {name}: expected auto, cpu, cuda or cuda:N")
    return device


def use_deterministic_kernels(device: torch.device) -> None:
    """On CUDA, pick deterministic cuDNN and CUDA kernels (process-wide), so one seed gives one set of
    weights on one GPU and ``--resume`` continues exactly, as on the CPU; an op with no deterministic
    CUDA kernel warns instead of failing. Nothing to do on the CPU."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS reads it when its handle is made
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The training config of a run folder, checked, without building its controller (CheckpointError naming the file)."""
    run_dir = Path(run_dir)
    raw = read_config(run_dir)
    try:
        config = TrainConfig.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{run_dir / CONFIG_FILE}: not a valid training config ({exc})") from None
    check_versions(run_dir)
    return config


def load_run(run_dir: str | Path, device: str = "cpu", raw: bool = False) -> tuple[torch.nn.Module, TrainConfig]:
    """The best-validation controller of a run folder, in eval mode, and its training config.

    Its predictions are recalibrated by ``RUN/calibration.json`` when there is one (``nsacdrive
    calibrate``), unless ``raw``, and scored by ``RUN/density.safetensors`` when there is one (raw or not)."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    model = build_controller(config.model)
    load_weights(model, run_dir / WEIGHTS_FILE)
    model.calibration = None if raw else read_calibration(run_dir)
    attach_density(model, read_density(run_dir))
    return model.to(pick_device(device)).eval(), config
