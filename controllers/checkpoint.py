"""Run folders: ``config.json`` (the full training config, model included) + safetensors weights.

Layout of a run folder::

    config.json            TrainConfig (data, split, model, optimiser, seed …)
    model.safetensors      best-validation weights (what evaluation and driving load)
    history.json           per-epoch losses, learning rate, timing
    resume/last.safetensors, resume/state.pt   last-epoch weights + optimiser/scheduler/counters
    tensorboard/           TensorBoard event files

Every file is written atomically. Loading checks that the files exist, parse, and that the
weights match the architecture the config describes; otherwise :class:`CheckpointError` says
which file and what disagrees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from safetensors import SafetensorError
from safetensors.torch import load_file, save

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A run folder that cannot be loaded; the message names the file and the problem."""


def save_weights(module: torch.nn.Module, path: Path) -> None:
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in module.state_dict().items()}
    atomic_write_bytes(path, save(state))


def load_weights(module: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights strictly; mismatches with the architecture raise CheckpointError."""
    if not path.exists():
        raise CheckpointError(f"{path}: weights file is missing")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    if missing or unexpected or wrong_shape:
        details = []
        if missing:
            details.append(f"missing {missing[:5]}{' …' if len(missing) > 5 else ''}")
        if unexpected:
            details.append(f"unexpected {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}")
        if wrong_shape:
            k = wrong_shape[0]
            details.append(f"{len(wrong_shape)} tensors of the wrong shape, e.g. {k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}")
        raise CheckpointError(f"{path}: weights do not match the architecture in {CONFIG_FILE} ({'; '.join(details)})")
    module.load_state_dict(state, strict=True)


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / CONFIG_FILE, config)


def read_config(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"{run_dir}: run folder does not exist")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: config file is missing") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
