"""Worker-process setup shared by every process pool (collection, evaluation, sweeps).

Each worker runs one episode at a time with batch-1 inference: extra BLAS/OpenMP threads gain
nothing there, and N workers × M threads on a small machine oversubscribe the cores and slow
every step down many times over. Workers therefore run single-threaded. They also end with the
process that started them: a killed ``nsacdrive sweep`` must not leave trainings running that
go on writing its run folders (a restarted sweep would then meet them there).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
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


def pool_worker(parent_pid: int) -> None:
    """Process-pool initializer: single-threaded, quick to exit (:mod:`nsacdrive.common.shutdown`), and
    terminated when ``parent_pid`` exits (Linux; elsewhere only single-threaded). Exits at once if
    that parent is already gone."""
    single_threaded_worker()
    skip_final_collection()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before the request could take effect
            os._exit(1)


def pool_initializer() -> Callable[[], None]:
    """The initializer every process pool of this package uses: :func:`pool_worker` bound to this process."""
    return functools.partial(pool_worker, os.getpid())


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
