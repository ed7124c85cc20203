"""Keep freed memory in the process instead of handing it back to the OS after every step.

A training step allocates and frees the same large tensors (activations, their gradients) every
time. glibc's malloc serves blocks above its mmap threshold with fresh ``mmap`` pages and gives
the free top of its heap back once it exceeds the trim threshold, so each step faults its pages
in again — on a virtual machine that costs a sizeable share of a CPU training step
(``bench/training_speed.py`` measures it). :func:`keep_freed_memory` serves every block from the
heap (no ``mmap`` per block: the threshold cannot be raised past 32 MiB, and a front-camera batch's
first activations are 37 MB) and stops the trimming: the process keeps its high-water mark of heap
memory and reuses it. Elsewhere (another C library, or a platform without glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4  # how many blocks may be mmap-ed at once; 0: none (the heap grows by mmap itself where brk cannot)
NEVER_TRIM = 2**31 - 1  # mallopt takes an int


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep and reuse freed memory (process-wide, once); True when it applied."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    # setting either also turns glibc's own adaptive thresholds off
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
