"""One writer per output folder (nsacdrive.common.folder_lock) and the commands that take the lock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from data_fixtures import normalize
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.common.folder_lock import LOCK_FILE, FolderBusy, folder_lock


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    with folder_lock(tmp_path / "out", "nsacdrive collect"):
        record = json.loads((tmp_path / "out" / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["command"] == "nsacdrive collect"
        with pytest.raises(FolderBusy, match=rf"out is in use by nsacdrive collect \(pid {os.getpid()} on .*\): two jobs"):
            with folder_lock(tmp_path / "out", "nsacdrive eval"):
                pytest.fail("two holders")
    assert not (tmp_path / "out").exists()  # created by the lock, left empty: removed


def test_the_lock_file_goes_and_a_folder_with_results_stays(tmp_path):
    with folder_lock(tmp_path / "out", "nsacdrive train"):
        (tmp_path / "out" / "config.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json"]
    with folder_lock(tmp_path / "out", "nsacdrive train"):  # free again
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    holder = textwrap.dedent(f"""
        import os, signal
        from nsacdrive.common.folder_lock import folder_lock
        with folder_lock({str(tmp_path / 'out')!r}, "nsacdrive collect"):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", holder]).returncode == -9
    left = json.loads((tmp_path / "out" / LOCK_FILE).read_text())
    assert left["command"] == "nsacdrive collect" and left["pid"] != os.getpid()  # the dead holder's record stays...
    with folder_lock(tmp_path / "out", "nsacdrive collect"):  # ...and is taken over
        assert json.loads((tmp_path / "out" / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "out" / LOCK_FILE).exists()


def test_a_lock_file_released_between_open_and_lock_is_not_trusted(tmp_path, monkeypatch):
    """The holder deletes its file on release: a waiter that opened the old file must lock the new one."""
    folder = tmp_path / "out"
    folder.mkdir()
    flocked: list[int] = []
    real_flock = fcntl.flock

    def flock_after_release(fd, operation):
        if not flocked:  # the first attempt: the file this fd opened is deleted (released) before the lock is taken
            os.unlink(folder / LOCK_FILE)
        flocked.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_release)
    with folder_lock(folder, "nsacdrive eval"):
        assert len(flocked) == 2 and (folder / LOCK_FILE).exists()


@pytest.mark.parametrize("command", [
    ["collect", "--seeds", "0", "--max-steps", "10", "--workers", "1"],
    ["train", "--data", "DATA", "--epochs", "1", "--device", "cpu"],
    ["sweep", "--data", "DATA", "--seeds", "0", "--epochs", "1", "--device", "cpu"],
    ["dagger", "--init", "RUN", "--rounds", "1", "--workers", "1"],
])
def test_every_writing_command_refuses_a_folder_in_use(tmp_path, command):
    from data_fixtures import write_synthetic

    for seed in range(3):
        write_synthetic(tmp_path / "data", f"ep{seed}", 60, track_seed=seed, textured=False)
    out = tmp_path / "out"
    args = [str(tmp_path / "data") if a == "DATA" else str(tmp_path / "no-run") if a == "RUN" else a for a in command]
    with folder_lock(out, "nsacdrive collect"):
        result = invoke(*args, "--out", out)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written beside the holder's lock
    assert result.exit_code == 2, result.output
    assert normalize(result.output).startswith(f"error: --out: {out} is in use by nsacdrive collect (pid {os.getpid()}")


def test_eval_refuses_a_folder_in_use(tmp_path):
    from run_fixtures import tiny_run

    run = tiny_run(tmp_path)
    with folder_lock(tmp_path / "eval", "nsacdrive eval"):
        result = invoke("eval", run, "--seeds", "1000", "--max-steps", "20", "--workers", "1", "--out", tmp_path / "eval")
    assert result.exit_code == 2 and "is in use by nsacdrive eval" in normalize(result.output)
    assert not (tmp_path / "eval").exists()


def test_two_collects_resuming_into_one_folder_one_refused(tmp_path):
    """The race of the battery: a second `collect --resume` while the first writes; the first finishes whole."""
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import sys
        from nsacdrive.cli import app
        sys.argv = ["nsacdrive", "collect", "--seeds", "0-1", "--max-steps", "150", "--workers", "1", "--resume", "--out", {str(out)!r}]
        app()
    """)
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
    try:
        for _ in range(600):  # wait until the first one holds the lock (its imports take a few seconds)
            if (out / LOCK_FILE).exists() and (out / LOCK_FILE).read_text():
                break
            if first.poll() is not None:
                pytest.fail(f"the first collect ended before it took the lock: {first.stdout.read()}")
            time.sleep(0.05)
        second = invoke("collect", "--seeds", "0-1", "--max-steps", "150", "--workers", "1", "--resume", "--out", out)
    finally:
        output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    if second.exit_code == 0:  # the first had already finished: the second found everything complete
        assert "skipped 2 already complete" in second.output
    else:
        assert second.exit_code == 2 and "is in use by nsacdrive collect" in normalize(second.output)
    assert "wrote 2 episodes" in output and not (out / LOCK_FILE).exists()


def test_the_lock_is_hidden_from_dataset_readers(tmp_path):
    from data_fixtures import write_synthetic

    from nsacdrive.data_collection.summary import summarize

    write_synthetic(tmp_path / "data", "ep0", 30, track_seed=0, textured=False)
    with folder_lock(tmp_path / "data", "nsacdrive collect"):
        assert summarize(Path(tmp_path / "data"), on_error="raise").to_dict()["episodes"] == 1
