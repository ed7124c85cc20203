"""Processes exit without a last garbage collection over their imports (common/shutdown.py): the
CLI and every pool worker register it; exit handlers registered later still run first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nsacdrive.common.workers import worker_pool

#: a reference cycle with finalizers left for the collector at exit, and an exit handler of its own
EXITING = """
import atexit, sys
from nsacdrive.common.shutdown import skip_final_collection
if sys.argv[1] == "skip":
    skip_final_collection()
atexit.register(print, "handler ran", flush=True)
class Node:
    def __del__(self):
        print("collected", flush=True)
first, second = Node(), Node()
first.other, second.other = second, first
del first, second
print("end", flush=True)
"""


def exit_output(mode: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", EXITING, mode], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.parametrize("mode", ["skip", "default"])
def test_the_collection_at_exit_is_skipped_after_every_other_exit_handler(mode: str):
    """Skipped, the cycle is never collected (its finalizers do not run, which Python does not promise
    at exit anyway); the control shows the interpreter's own last collection finding it."""
    words = exit_output(mode)
    assert words[:3] == ["end", "handler", "ran"]
    assert words[3:] == ([] if mode == "skip" else ["collected", "collected"])


def registered_in_this_process() -> int:
    from nsacdrive.common.shutdown import skip_final_collection

    return skip_final_collection.cache_info().currsize


def test_pool_workers_skip_it_and_the_cli_does_too():
    with worker_pool(1, registered_in_this_process) as pool:
        assert pool.submit(registered_in_this_process).result() == 1
    from typer.testing import CliRunner

    from nsacdrive.cli import app
    from nsacdrive.common.shutdown import skip_final_collection

    skip_final_collection.cache_clear()  # another test of this process may have run a command already
    assert CliRunner().invoke(app, ["env", "presets"]).exit_code == 0
    assert registered_in_this_process() == 1
