"""Atomic file writes: write to a temporary file in the target folder, fsync, then rename.

A reader (or a resumed job) therefore sees either the old file or the complete new one, never
a half-written file. Temporary files carry the suffix ``.partial`` so a resume can clean them.
Whole folders are staged the same way and swapped in by :func:`replace_folder`.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PARTIAL_SUFFIX = ".partial"
STALE_SUFFIX = ".stale"  # a replaced folder, deleted once its successor is in place


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    _default_permissions(tmp, 0o666)  # mkstemp creates 0600
    try:
        with _naming(target):
            yield tmp
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def _naming(target: Path) -> Iterator[None]:
    """Give an OSError that names no file (a write or fsync on a full disk: ``[Errno 28] No space
    left on device``) the file being written, so the message says where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc


@contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it is renamed to ``path``, so the
    folder appears complete or not at all (``path`` must not be a non-empty folder). On an error
    the temporary folder is removed; a killed process leaves it for its caller's cleanup."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX, dir=target.parent))
    _default_permissions(tmp, 0o777)  # mkdtemp creates 0700
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _default_permissions(path: Path, mode: int) -> None:
    """Give ``path`` ``mode`` less the umask, as a plain open() or mkdir() would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_write_npz(path: str | os.PathLike[str], arrays: dict[str, Any]) -> None:
    """A compressed ``.npz`` of named arrays, written atomically."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def json_safe(value: Any) -> Any:
    """NaN and ±inf → None in nested dicts and lists, so the file is standard JSON (browsers and
    most tools reject ``NaN``)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def remove_abandoned_stages(parent: str | os.PathLike[str], prefix: str, suffix: str = PARTIAL_SUFFIX) -> int:
    """Delete ``parent/{prefix}.{pid}{suffix}`` (a job's staging folder or file) whose process
    ``pid`` no longer runs: what a killed job left behind. Stages of running jobs stay; returns
    how many were removed."""
    removed = 0
    for stage in Path(parent).glob(f"{glob.escape(prefix)}.*{glob.escape(suffix)}"):
        pid = stage.name[len(prefix) + 1 : len(stage.name) - len(suffix)]
        if pid.isdigit() and not _is_running(int(pid)):
            if stage.is_dir():
                shutil.rmtree(stage, ignore_errors=True)
            else:
                stage.unlink(missing_ok=True)
            removed += 1
    return removed


def replace_folder(staged: Path, target: Path, accept_existing: Callable[[Path], bool] | None = None) -> None:
    """Rename the finished folder ``staged`` to ``target``, replacing what is there.

    A reader sees the old folder or the new one, and a failure before the call keeps the old one
    whole. An existing ``target`` is first renamed aside to ``staged``'s name with
    :data:`STALE_SUFFIX` for :data:`PARTIAL_SUFFIX`, so ``remove_abandoned_stages(parent, prefix,
    STALE_SUFFIX)`` finds what a killed process left, then deleted.

    :param staged: the complete new folder, beside ``target`` (a rename stays on one file system).
    :param target: the folder to create or replace.
    :param accept_existing: when the rename fails because another process moved its own folder to
        ``target`` meanwhile, ``accept_existing(target)`` says whether that folder will do; then
        ``staged`` is left for the caller to delete. Without it (or when it says no) the error is raised.
    """
    stale = target.parent / (staged.name.removesuffix(PARTIAL_SUFFIX) + STALE_SUFFIX)
    if target.exists():
        os.rename(target, stale)
    try:
        os.rename(staged, target)
    except OSError:
        if accept_existing is None or not accept_existing(target):
            raise
    shutil.rmtree(stale, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_partial_files(folder: str | os.PathLike[str]) -> int:
    """Delete leftovers of interrupted atomic writes in ``folder``; returns how many."""
    removed = 0
    for leftover in Path(folder).glob(f".*{PARTIAL_SUFFIX}"):
        leftover.unlink()
        removed += 1
    return removed
