"""`nsacdrive episodes`: one line per closed-loop episode with its misbehaviour events."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.eval.closed_loop import LOG_FIELDS
from nsacdrive.eval.episode_table import LINE_WIDTH


def write_episode(folder, episode_id: str, off_road: slice | None = None, failed: bool = False, steps: int = 300,
                  reason: str = "lap_finished", fallback: float = 0.0) -> None:
    """A record and a per-step log in which the car is off the road during ``off_road``."""
    record = {"episode_id": episode_id, "failed": failed, "reason": "model raised" if failed else reason,
              "lap_finished": not failed and reason == "lap_finished", "score": 0.0 if failed else 912.5,
              "steps": 0 if failed else steps, "fallback_fraction": fallback}
    (folder / f"{episode_id}.json").write_text(json.dumps(record))
    if failed:
        return
    arrays = {name: np.zeros((steps, 3), np.float32) for name in LOG_FIELDS}
    arrays.update(speed=np.full(steps, 50.0, np.float32), lateral_error=np.zeros(steps, np.float32),
                  heading_error=np.zeros(steps, np.float32))
    if off_road is not None:
        arrays["lateral_error"][off_road] = 8.0
    np.savez(folder / f"{episode_id}.npz", **arrays)


def test_each_episode_says_when_and_how_it_misbehaved(tmp_path):
    episodes = tmp_path / "eval" / "episodes"
    episodes.mkdir(parents=True)
    write_episode(episodes, "run_default_seed000042_r0")
    write_episode(episodes, "run_shift-3_seed001000_r0_" + "lens-dirt-4" * 8, off_road=slice(100, 125))
    write_episode(episodes, "run_shift-3_seed001001_r0", failed=True)
    result = CliRunner().invoke(app, ["episodes", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= LINE_WIDTH and lines[0].split() == ["episode", "lap", "score", "secs", "events"]
    assert lines[1].startswith("run_default_seed000042_r0") and lines[1].split()[1:] == ["yes", "912.5", "6.0", "none"]
    assert "…" in lines[2] and lines[2].endswith("off_road 2.0–2.5 s")
    assert lines[3].endswith("fault: model raised")
    only = CliRunner().invoke(app, ["episodes", str(tmp_path / "eval"), "--misbehaving"]).output.splitlines()
    assert only == [lines[0], lines[2], lines[3]]


def test_a_folder_without_episodes_is_one_error_line(tmp_path):
    result = CliRunner().invoke(app, ["episodes", str(tmp_path)])
    assert result.exit_code == 2 and result.output.strip() == f"error: {tmp_path / 'episodes'}: no episode records found"


def test_a_safe_stop_and_the_time_under_the_fallback_are_shown(tmp_path):
    episodes = tmp_path / "eval" / "episodes"
    episodes.mkdir(parents=True)
    write_episode(episodes, "run_shift-3_seed001000_r0", steps=250, reason="safe_stop", fallback=0.4)
    lines = CliRunner().invoke(app, ["episodes", str(tmp_path / "eval"), "--misbehaving"]).output.splitlines()
    assert lines[1].split()[1] == "no" and lines[1].endswith("40 % under the fallback; safe stop at 5.0 s; none")
