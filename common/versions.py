"""The software versions a result was made with (``versions.json`` beside it), checked when it is read.

Run folders, evaluation aggregates, offline tables and datasets each get one record. Reading a
run made under another nsacdrive or torch major version warns (:class:`VersionWarning`, through
:mod:`warnings`, so library callers can filter or escalate it and the CLI shows it on stderr)
with both versions: the weights may still load, but results can differ.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import re
import subprocess
import warnings
from pathlib import Path

from nsacdrive.common.atomic import atomic_write_json

VERSIONS_FILE = "versions.json"
PACKAGES = ("nsacdrive", "torch", "gymnasium", "numpy")
#: packages whose major version is compared when a record is read
COMPARED = ("nsacdrive", "torch")


class VersionWarning(UserWarning):
    """A result was made under another major version of nsacdrive or torch than the one running."""


def current_versions() -> dict[str, str | None]:
    """Versions of the packages in :data:`PACKAGES`, Python, and the git commit of nsacdrive's source (or None)."""
    versions = {name: _package_version(name) for name in PACKAGES}
    versions["python"] = platform.python_version()
    versions["git_commit"] = source_commit()
    return versions


def write_versions(folder: str | Path) -> None:
    """Record :func:`current_versions` in ``folder/versions.json`` (atomically)."""
    atomic_write_json(Path(folder) / VERSIONS_FILE, current_versions())


def check_versions(folder: str | Path) -> None:
    """Warn if ``folder/versions.json`` names another major version of a :data:`COMPARED` package.

    Folders without a record (made before records were written) pass silently; an unreadable
    record warns, naming the file.
    """
    path = Path(folder) / VERSIONS_FILE
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        warnings.warn(f"{path}: unreadable versions record ({exc})", VersionWarning, stacklevel=2)
        return
    for name in COMPARED:  # only these: current_versions() would also run git for the commit
        made, running = recorded.get(name), _package_version(name)
        if made and running and _major(made) != _major(running):
            warnings.warn(f"{path}: made with {name} {made}, now running {name} {running} (another major version; "
                          "results may differ)", VersionWarning, stacklevel=2)


def _major(version: str) -> str:
    return str(version).split(".")[0]


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def source_commit() -> str | None:
    """HEAD of the git checkout this file is tracked in; None without git, outside a checkout, or
    when this file is not part of it (e.g. installed into a virtual environment inside another repository)."""
    here = Path(__file__).resolve()
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", here.name], cwd=here.parent,
                                 capture_output=True, timeout=10, check=False)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here.parent, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    if tracked.returncode != 0 or head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return None
    return commit
