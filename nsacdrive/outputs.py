"""Checks that a command can write its outputs, made before it does any work.

Nothing is created: the nearest existing folder on the way to the output takes (and drops) a
temporary file, so a mistyped ``--out`` or a read-only disk fails in a second, not after hours.
The checks raise :class:`OSError` subclasses, which the CLI prints as one ``error:`` line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def check_output_folder(path: Path, option: str = "--out") -> None:
    """Fail unless ``path`` is, or can become, a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{option}: {path} is a file, expected a folder")
    _check_writable(_nearest_existing(path, option), option)


def check_output_file(path: Path, option: str = "--out") -> None:
    """Fail unless ``path`` can be written as a file (its folder may still have to be created)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{option}: {path} is a folder, expected a file")
    check_output_folder(path.parent, option)


def _nearest_existing(path: Path, option: str) -> Path:
    """The deepest existing folder on the way to ``path``; a file on the way is an error."""
    existing = next(ancestor for ancestor in (path, *path.parents) if ancestor.exists())  # at worst "." or "/"
    if not existing.is_dir():
        raise NotADirectoryError(f"{option}: {path} cannot be created: {existing} is a file")
    return existing


def _check_writable(folder: Path, option: str) -> None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise PermissionError(f"{option}: cannot write in {folder} ({exc.strerror or exc})") from None
