"""Produce the next items of an iterable on a background thread while the caller works on this one.

Training gathers a batch (frame decoding, augmentation: OpenCV and NumPy work that releases the
GIL) and then runs the model step (PyTorch, which releases it too); :func:`prefetched` overlaps the
two. The items and their order are exactly the iterable's: only *when* each is made changes, so
anything that draws random numbers while producing an item must use its own generator, not a
process-wide one the consumer also draws from.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_POLL_SECONDS = 0.05  # how often a producer blocked on a full buffer checks whether the consumer left


class _End:
    """The producer's last message: the iterable ran out (``error`` None) or raised ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


@contextmanager
def prefetched(items: Iterable[T], depth: int = 1, name: str = "nsacdrive-prefetch") -> Iterator[Iterator[T]]:
    """``with prefetched(loader) as batches: for batch in batches: …`` — the items of ``items``, up to
    ``depth`` of them made ahead on a thread called ``name``. An exception raised while producing an
    item is raised again where the consumer asks for that item; leaving the block early (a break, an
    error) stops the producer after the item it is making and waits for it."""
    if depth < 1:
        raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    buffer: queue.Queue[T | _End] = queue.Queue(depth)
    leaving = threading.Event()

    def offer(message: T | _End) -> bool:
        """Put ``message`` in the buffer unless the consumer has left; whether it was put."""
        while not leaving.is_set():
            try:
                buffer.put(message, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            offer(_End(error))
            return
        offer(_End())

    def consume() -> Iterator[T]:
        while True:
            message = buffer.get()
            if isinstance(message, _End):
                if message.error is not None:
                    raise message.error
                return
            yield message

    producer = threading.Thread(target=produce, name=name, daemon=True)
    producer.start()
    try:
        yield consume()
    finally:
        leaving.set()
        producer.join()
