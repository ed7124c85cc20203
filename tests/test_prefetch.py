"""Prefetching: the iterable's items, in order, made ahead on a background thread; errors reach the
consumer at the item that failed; leaving early stops the producer."""

from __future__ import annotations

import threading

import pytest

from nsacdrive.common.prefetch import prefetched


@pytest.mark.parametrize("depth", [1, 3])
def test_every_item_arrives_in_order(depth: int):
    with prefetched(range(50), depth=depth) as items:
        assert list(items) == list(range(50))


def test_items_are_made_on_another_thread_ahead_of_the_consumer():
    makers: list[str] = []
    made = threading.Event()

    def produce():
        for item in range(3):
            makers.append(threading.current_thread().name)
            if item == 1:
                made.set()
            yield item

    with prefetched(produce(), depth=1, name="test-prefetch") as items:
        assert next(items) == 0
        assert made.wait(timeout=10)  # item 1 is made while the consumer still holds item 0
        assert list(items) == [1, 2]
    assert makers == ["test-prefetch"] * 3


def test_an_error_while_producing_is_raised_at_the_item_that_failed():
    def produce():
        yield 0
        yield 1
        raise OSError("frame store unreadable")

    received = []
    with pytest.raises(OSError, match="frame store unreadable"), prefetched(produce()) as items:
        for item in items:
            received.append(item)
    assert received == [0, 1]


def test_leaving_early_stops_the_producer():
    made: list[int] = []

    def produce():
        for item in range(1000):
            made.append(item)
            yield item

    with prefetched(produce(), depth=2) as items:
        assert next(items) == 0
    assert not any(thread.name == "nsacdrive-prefetch" for thread in threading.enumerate())
    assert len(made) <= 1 + 2 + 1  # the consumed item, a full buffer and the one being offered


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth"), prefetched(range(3), depth=0):
        pass
