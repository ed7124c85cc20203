"""Worker-process setup shared by every process pool (collection, evaluation).

Each worker runs one episode at a time with batch-1 inference: extra BLAS/OpenMP threads gain
nothing there, and N workers × M threads on a small machine oversubscribe the cores and slow
every step down many times over. Workers therefore run single-threaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def single_threaded_worker() -> None:
    """Process-pool initializer: one compute thread per worker process."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


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
