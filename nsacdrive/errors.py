"""The command line's one error path: what ends a command with one ``error:`` line and exit code 2.

A refusal the user can act on prints as ``error: REASON``: bad input (configs, run folders,
datasets, evaluations: the library's errors are ValueErrors), the filesystem (OSError), an output
folder another job holds, an optional extra that is not installed. Usage errors keep click's
usage message, and anything else — a bug — keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from nsacdrive.common.extras import MissingExtra
from nsacdrive.common.folder_lock import FolderBusy
from nsacdrive.common.resume import SettingsChanged


class Refusal(Exception):
    """A refusal worded by the command line, e.g. a library error prefixed with the run it concerns."""


REFUSALS: tuple[type[Exception], ...] = (Refusal, ValueError, OSError, FolderBusy, MissingExtra)


def reason(exc: Exception, flags: Mapping[str, str] | None = None) -> str:
    """The one line that explains ``exc``: an OSError as ``FILE: what went wrong``, a resume with
    other settings by the flags that changed (``flags``: config field → flag; their folder is ``--out``)."""
    if isinstance(exc, SettingsChanged) and flags is not None:
        return exc.describe(flags, folder="--out")
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


@contextlib.contextmanager
def concerning(subject: str, kinds: tuple[type[Exception], ...] = REFUSALS) -> Iterator[None]:
    """Put ``subject`` (the run, the server, the flag) in front of a refusal of ``kinds`` raised in the
    body, so its one line says what it is about."""
    try:
        yield
    except kinds as exc:
        raise Refusal(f"{subject}: {reason(exc)}") from exc
