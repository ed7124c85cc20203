"""Worker-process setup shared by every process pool (collection, evaluation, sweeps).

Each worker runs one episode at a time with batch-1 inference: extra BLAS/OpenMP threads gain
nothing there, and N workers × M threads on a small machine oversubscribe the cores and slow
every step down many times over. Workers therefore run single-threaded. They also end with the
process that started them: a killed ``nsacdrive sweep`` must not leave trainings running that
go on writing its run folders (a restarted sweep would then meet them there).

Workers are not spawned afresh: they are forked from a fork server (:func:`worker_context`) that
imported the tasks' module — and with it torch, the envs and the controllers — once, so a worker
starts in milliseconds instead of spending ~1.2 s on its own imports; nothing is forked from the
calling process, whose OpenMP threads would not survive a fork.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from nsacdrive.common.shutdown import skip_final_collection

#: prctl option: the signal the kernel sends this process when the thread that started it exits (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def single_threaded_worker() -> None:
    """Process-pool initializer: one compute thread per worker process."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pool_worker(parent_pid: int, environment: dict[str, str]) -> None:
    """Process-pool initializer: the starting process's ``environment`` (a fork server's own dates
    from its start), single-threaded, quick to exit (:mod:`nsacdrive.common.shutdown`), and sent
    SIGTERM when ``parent_pid`` exits (Linux; elsewhere only single-threaded). Exits at once if
    ``parent_pid`` is already gone."""
    adopt_environment(environment)
    single_threaded_worker()
    skip_final_collection()
    if sys.platform.startswith("linux"):
        _end_with(parent_pid)


def adopt_environment(environment: dict[str, str]) -> None:
    """Make ``environment`` (the starting process's, taken when it started this one) this process's:
    a process forked by the fork server would otherwise have the server's, from the server's start."""
    os.environ.clear()
    os.environ.update(environment)


def _end_with(parent_pid: int) -> None:
    """SIGTERM for this process when ``parent_pid`` exits. The kernel's parent-death signal covers a
    process that ``parent_pid`` started itself; a worker forked by the fork server also gets a thread
    that waits on ``parent_pid``'s pidfd (the server outlives the parent while any worker runs)."""
    import ctypes

    forker = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if forker == parent_pid:
        if os.getppid() != parent_pid:  # the parent died before the request could take effect
            os._exit(1)
        return
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)

    def wait_for_parent() -> None:
        watch = select.poll()
        watch.register(pidfd, select.POLLIN)  # readable once the process has exited
        watch.poll()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_for_parent, name="nsacdrive-parent-watch", daemon=True).start()


def worker_context(preload: str | None = None) -> multiprocessing.context.BaseContext:
    """The start method of every worker process of this package: a fork server (spawn where the
    platform has none, or no pidfds). The server is one per process; it starts with the first worker (or
    :func:`start_worker_server`) and first imports ``preload``, the module of the workers' task;
    a server already running keeps what it imported. C libraries it imported read their
    environment variables then, not at each worker's start."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not hasattr(os, "pidfd_open"):
        return multiprocessing.get_context("spawn")  # a forked worker could not watch its parent (_end_with)
    context = multiprocessing.get_context("forkserver")
    if preload and preload != "__main__":
        context.set_forkserver_preload([preload])
    return context


def worker_pool(workers: int, task: Callable) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes forked from the server that imported ``task``'s module, each
    started by :func:`pool_worker` with this process's pid and its environment now."""
    return ProcessPoolExecutor(workers, mp_context=worker_context(task.__module__),
                               initializer=functools.partial(pool_worker, os.getpid(), dict(os.environ)))


def start_worker_server(preload: str) -> None:
    """Start the fork server now, importing ``preload`` beside this process's own imports: a
    command that will start workers calls it before its heavy imports."""
    if isinstance(worker_context(preload), multiprocessing.context.ForkServerContext):
        multiprocessing.forkserver.ensure_running()


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run a block with ``count`` torch compute threads (batch-1 driving in the main process, e.g.
    re-driving episodes for a report), then restore the previous number."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
