"""Process-pool workers (common/workers.py): forked from one fork server, with the caller's environment
at their start, ending with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.context import ForkServerContext
from pathlib import Path

import pytest

from nsacdrive.common.workers import start_worker_server, worker_context, worker_pool

#: a parent that starts one pool worker, which records its pid and then works "forever"
PARENT = """
import sys, time
from pathlib import Path
from nsacdrive.common.workers import worker_pool

def task(path):
    import os
    Path(path).write_text(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    with worker_pool(1, task) as pool:
        pool.submit(task, sys.argv[1]).result()
"""


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for a reaper (whatever this machine's PID 1 does)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_pool_worker_ends_when_its_parent_is_killed(tmp_path):
    script, pid_file = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    with open(tmp_path / "parent.err", "w") as errors:  # the killed parent's resource tracker warns about its semaphores there
        parent = subprocess.Popen([sys.executable, str(script), str(pid_file)], stderr=errors)
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60), "the worker never started its task"
        worker = int(pid_file.read_text())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)  # no chance to shut the pool down: only the kernel can end the worker
        parent.wait(10)
        assert wait_for(lambda: not alive(worker), 10), "the worker outlived its killed parent"
    finally:
        parent.kill()
        parent.wait(10)


def worker_facts(name: str) -> tuple[int, int, str | None]:
    """A worker's pid, its parent's pid and its value of the environment variable ``name``."""
    return os.getpid(), os.getppid(), os.environ.get(name)


@pytest.mark.skipif(not isinstance(worker_context(), ForkServerContext), reason="workers are spawned where there is no fork server")
def test_workers_are_forked_by_one_server_with_the_callers_environment_now(monkeypatch):
    start_worker_server(__name__)
    with worker_pool(2, worker_facts) as pool:
        first = pool.submit(worker_facts, "NSACDRIVE_WORKER_TEST").result()
    monkeypatch.setenv("NSACDRIVE_WORKER_TEST", "set after the server started")
    with worker_pool(2, worker_facts) as pool:
        second = pool.submit(worker_facts, "NSACDRIVE_WORKER_TEST").result()
    assert first[1] == second[1] != os.getpid()  # both forked by the same server, not by this process
    assert first[0] != second[0]
    assert first[2] is None and second[2] == "set after the server started"
