"""One writer per output folder: ``collect``, ``train``, ``sweep``, ``eval`` and ``dagger`` hold
``FOLDER/.nsacdrive.lock`` while they write there.

Two jobs writing one folder race on each other's temporary files and sidecars, so the second
one is refused at once, with the first one's command and pid. The lock is an advisory
``flock`` on the lock file, which the kernel drops when its process ends however it ends
(SIGKILL, a crash, a reboot): a lock file left by a process that no longer runs is simply taken
over, with no pid guessing. The file records its holder (pid, host, command, start time) for the
refusal's message, and is deleted when the job ends.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".nsacdrive.lock"  # hidden: no dataset, run or evaluation reader takes it for one of its files


class FolderBusy(RuntimeError):
    """Another running job holds the output folder's lock; the message names it."""


@contextmanager
def folder_lock(folder: str | os.PathLike[str], command: str) -> Iterator[Path]:
    """Hold ``folder``'s lock for the body (creating the folder if needed) and yield the folder.

    :param folder: the output folder; when the lock creates it and the body leaves it empty (a job
        refused before it wrote anything), it is removed again, so nothing half-made stays
    :param command: what holds the lock, for the refusal another job gets (``"nsacdrive collect"``)
    :raises FolderBusy: when a running process holds the lock
    """
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = _acquire(path, folder)
    try:
        if fd is not None:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                      "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(holder) + "\n").encode())
        yield folder
    finally:
        if fd is not None:
            path.unlink(missing_ok=True)  # still locked: a job that opened this file before the unlink retries on a new one
            os.close(fd)
        if created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the job wrote something
                pass


def _acquire(path: Path, folder: Path) -> int | None:
    """An open descriptor of ``path`` holding its exclusive lock; None (with a warning) on a file
    system without locks."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise FolderBusy(f"{folder} is in use by {holder}: two jobs writing one folder would spoil each other's "
                                 "files; wait for it to end, stop it, or choose another folder") from None
            warnings.warn(f"cannot lock {folder} ({exc.strerror}): make sure no other job writes there", stacklevel=3)
            return None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            return fd
        os.close(fd)  # the holder released and deleted this file after we opened it: lock the current one


def _holder(fd: int) -> str:
    """Who holds the lock, as its file records it (a holder that has not written it yet: 'another job')."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"null")
        return f"{record['command']} (pid {record['pid']} on {record['host']}, since {record['started']})"
    except (OSError, ValueError, TypeError, KeyError):
        return "another job"
