"""Run folders: ``config.json`` (the full training config, model included) + safetensors weights.

Layout of a run folder::

    config.json            TrainConfig (data, split, model, optimiser, seed …)
    versions.json          the software versions the run was made with (nsacdrive.common.versions)
    model.safetensors      best-validation weights (what evaluation and driving load)
    checksums.json         sha256 of model.safetensors, checked whenever it is loaded
    history.json           per-epoch losses, learning rate, timing
    resume/epoch-NNNN/     the checkpoint after epoch NNNN: last.safetensors, best.safetensors,
                           state.json + state.safetensors (optimiser, scheduler, counters; no pickle,
                           :mod:`nsacdrive.controllers.state_codec`) and their checksums.json
    tensorboard/           TensorBoard event files

Every file is written atomically, and a checkpoint is ONE unit: its folder is written under a
temporary name and renamed when complete, so a kill while saving leaves the previous checkpoint
whole; ``model.safetensors`` and ``history.json`` are published from it afterwards (and again on
resume, repairing a kill in between). Loading checks that the files exist, parse, match their
recorded sha256, and that the weights match the architecture the config describes; otherwise
:class:`CheckpointError` says which file and what disagrees.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as parse_safetensors
from safetensors.torch import save

from nsacdrive.common.atomic import atomic_folder, atomic_write_bytes, atomic_write_json

CONFIG_FILE = "config.json"
HISTORY_FILE = "history.json"
WEIGHTS_FILE = "model.safetensors"
CHECKSUMS_FILE = "checksums.json"
RESUME_DIR = "resume"
LAST_WEIGHTS, BEST_WEIGHTS = "last.safetensors", "best.safetensors"
STATE_SKELETON, STATE_TENSORS = "state.json", "state.safetensors"
#: the pickled trainer state of older releases: never read (unpickling a folder from someone else runs their code)
PICKLED_STATE = "state.pt"
_EPOCH_FOLDER = re.compile(r"epoch-(\d{4,})")


class CheckpointError(ValueError):
    """A run folder that cannot be loaded; the message names the file and the problem."""


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file of ``tensors`` (and ``metadata``), the same bytes for the same content.

    The library writes metadata from a hash map, in an order that changes from one call to the next;
    with metadata the header's keys are sorted after saving. The header keeps its length (the same
    keys and values), so every offset holds."""
    blob = save(tensors, metadata)
    if metadata is None:
        return blob
    length = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8:8 + length]), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(header) > length:
        raise ValueError(f"safetensors header grew from {length} to {len(header)} bytes when sorted")
    return blob[:8] + header.ljust(length) + blob[8 + length:]


def weights_bytes(module: torch.nn.Module) -> bytes:
    """The safetensors file of ``module``'s state dict (CPU, contiguous)."""
    return safetensors_bytes({name: tensor.detach().cpu().contiguous() for name, tensor in module.state_dict().items()})


def save_weights(module: torch.nn.Module, path: Path) -> None:
    """Write ``module``'s weights to ``path`` and record their sha256 beside it."""
    write_recorded(Path(path), weights_bytes(module))


def write_recorded(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, then record its sha256 in the folder's ``checksums.json``."""
    atomic_write_bytes(path, data)
    _record(path, _sha256(data))


def _record(path: Path, digest: str) -> None:
    """Record ``digest`` as ``path``'s sha256 in its folder's ``checksums.json``, keeping the other entries."""
    atomic_write_json(path.parent / CHECKSUMS_FILE, {**read_checksums(path.parent), path.name: digest})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str | None:
    """The sha256 of the file at ``path``, read in blocks, or None when there is no such file."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def read_checksums(folder: Path) -> dict[str, str]:
    """File name → sha256 recorded in ``folder/checksums.json`` (empty when there is none)."""
    path = Path(folder) / CHECKSUMS_FILE
    try:
        checksums = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
        raise CheckpointError(f"{path}: expected an object of file name → sha256, got {checksums!r}")
    return checksums


def _recorded_sha256(path: Path) -> str | None:
    """The sha256 recorded for ``path`` in its folder's ``checksums.json``, or None."""
    return read_checksums(Path(path).parent).get(Path(path).name)


def _required_sha256(path: Path) -> str:
    """The sha256 recorded for ``path``; CheckpointError naming ``checksums.json`` when there is none."""
    expected = _recorded_sha256(path)
    if expected is None:
        raise CheckpointError(f"{path}: no sha256 recorded in {Path(path).parent / CHECKSUMS_FILE}, so a damaged or altered "
                              "file cannot be told from the one training wrote; every run folder `nsacdrive train` writes records it")
    return expected


def _read_recorded(path: Path) -> bytes:
    """The bytes of ``path``, read once and checked against the sha256 recorded beside it; no record
    or a mismatch raises CheckpointError naming ``path``."""
    path = Path(path)
    expected = _required_sha256(path)
    data = path.read_bytes()
    if (digest := _sha256(data)) != expected:
        raise CheckpointError(f"{path}: sha256 {digest[:12]}… differs from {expected[:12]}… recorded in {CHECKSUMS_FILE}; "
                              "the file is corrupt or was changed after it was saved (a training run killed while saving "
                              "is repaired by `train --resume`)")
    return data


def load_weights(module: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights strictly after checking their recorded sha256; a missing record, a
    corrupt file or a mismatch with the architecture raises CheckpointError."""
    if not path.exists():
        raise CheckpointError(f"{path}: weights file is missing")
    try:
        data = _read_recorded(path)
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    load_weights_bytes(module, data, path)


def load_weights_bytes(module: torch.nn.Module, data: bytes, path: Path) -> None:
    """Load the safetensors file ``data`` (read from ``path``, which errors name) strictly; bytes
    that do not parse or do not match the architecture raise CheckpointError."""
    try:
        state = parse_safetensors(data)
    except (SafetensorError, ValueError) as exc:
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


@dataclass(frozen=True)
class Checkpoint:
    """The resume state after one epoch, ``resume/epoch-NNNN/`` (see the module docstring)."""

    folder: Path

    FILES = (LAST_WEIGHTS, BEST_WEIGHTS, STATE_SKELETON, STATE_TENSORS)

    @property
    def epoch(self) -> int:
        """Epochs completed when this checkpoint was written."""
        return int(_EPOCH_FOLDER.fullmatch(self.folder.name).group(1))  # type: ignore[union-attr]

    def path(self, name: str) -> Path:
        return self.folder / name

    def read(self, name: str) -> bytes:
        """The bytes of file ``name``, read once and checked against their recorded sha256; a missing
        or corrupt file raises CheckpointError naming it."""
        if not self.path(name).exists():
            raise CheckpointError(f"{self.path(name)}: checkpoint file is missing")
        return _read_recorded(self.path(name))

    def read_all(self) -> dict[str, bytes]:
        """Every file of :attr:`FILES`, each read and checked once (see :meth:`read`). A checkpoint of
        an older release, whose trainer state is a pickle, is refused before anything is read."""
        if self.path(PICKLED_STATE).exists() and not self.path(STATE_SKELETON).exists():
            raise CheckpointError(f"{self.path(PICKLED_STATE)}: a trainer state saved as a pickle by an older nsacdrive; "
                                  "unpickling can run code from whoever made the folder, so it is never read. Its trained "
                                  f"weights are usable as they are ({WEIGHTS_FILE}); to train on, start a new run with "
                                  "init_from set to this run folder")
        return {name: self.read(name) for name in self.FILES}


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The complete checkpoint of the most epochs in ``run_dir/resume`` (unfinished writes are ignored), or None."""
    folders = [f for f in (Path(run_dir) / RESUME_DIR).glob("epoch-*") if f.is_dir() and _EPOCH_FOLDER.fullmatch(f.name)]
    return max((Checkpoint(f) for f in folders), key=lambda checkpoint: checkpoint.epoch, default=None)


def write_checkpoint(run_dir: Path, epoch: int, files: dict[str, bytes]) -> Checkpoint:
    """Write ``files`` (every name of :attr:`Checkpoint.FILES`) as the checkpoint of ``epoch``, as one unit:
    into a temporary folder, with their checksums, renamed to ``resume/epoch-NNNN`` when complete."""
    if set(files) != set(Checkpoint.FILES):
        raise ValueError(f"a checkpoint holds {Checkpoint.FILES}, got {sorted(files)}")
    final = Path(run_dir) / RESUME_DIR / f"epoch-{epoch:04d}"
    with atomic_folder(final) as partial:  # the commit point: the folder appears complete or not at all
        for name, data in files.items():
            atomic_write_bytes(partial / name, data)
        atomic_write_json(partial / CHECKSUMS_FILE, {name: _sha256(data) for name, data in files.items()})
    return Checkpoint(final)


def publish(run_dir: Path, checkpoint: Checkpoint) -> None:
    """Make ``run_dir/model.safetensors`` the checkpoint's best weights (rewritten only when its recorded
    or actual sha256 differs from theirs), and drop every other checkpoint and unfinished write in
    ``run_dir/resume``."""
    run_dir = Path(run_dir)
    digest = _required_sha256(checkpoint.path(BEST_WEIGHTS))
    target = run_dir / WEIGHTS_FILE
    if _recorded_sha256(target) != digest or _file_sha256(target) != digest:
        atomic_write_bytes(target, checkpoint.read(BEST_WEIGHTS))  # read checks the bytes against ``digest``
        _record(target, digest)
    for folder in (run_dir / RESUME_DIR).iterdir():
        if folder == checkpoint.folder:
            continue
        if folder.is_dir():
            shutil.rmtree(folder)
        else:
            folder.unlink()
