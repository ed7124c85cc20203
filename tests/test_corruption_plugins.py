"""Corruption families from a user's module: randomness fixed per episode, and workers that import
the module themselves (``nsacdrive eval --corruption-module``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nsacdrive.envs import corruptions

PLUGIN = Path(__file__).with_name("corruption_plugin.py")


@pytest.fixture
def plugin():
    """The plugin imported by path, and the suite restored afterwards."""
    before = dict(corruptions.CORRUPTIONS)
    corruptions.import_corruption_modules([str(PLUGIN)])
    yield
    corruptions.CORRUPTIONS.clear()
    corruptions.CORRUPTIONS.update(before)
    for name in [n for n in sys.modules if n.startswith("nsacdrive_corruption_plugin_")]:
        del sys.modules[name]


def dark_pixels(frame: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(*np.nonzero(frame.max(-1) == 0), strict=True))


def test_a_per_episode_family_stays_put_through_the_episode_and_moves_between_episodes(plugin):
    (spec,) = corruptions.parse_corruptions("sticker-3")
    frame = np.full((96, 96, 3), 180, np.uint8)
    places = [dark_pixels(spec(frame, seed=11, step=step)) for step in (0, 1, 57, 999)]
    assert places[0] and all(place == places[0] for place in places)
    assert dark_pixels(spec(frame, seed=12, step=0)) != places[0]
    assert len(places[0]) == int(0.15 * 96) ** 2


def test_a_module_that_is_no_module_is_named():
    with pytest.raises(ValueError, match=r"--corruption-module: cannot import 'no_such_plugin'"):
        corruptions.import_corruption_modules(["no_such_plugin"])
    with pytest.raises(ValueError, match=r"--corruption-module: .*missing\.py is not a Python file"):
        corruptions.import_corruption_modules([str(PLUGIN.with_name("missing.py"))])


def test_workers_forked_before_the_import_drive_a_registered_family(tmp_path):
    """Two workers fork from the evaluation's worker server, which starts before the command imports
    the plugin: each imports it itself from the drive config."""
    from run_fixtures import tiny_run

    run = tiny_run(tmp_path)
    command = [sys.executable, "-m", "nsacdrive.cli", "eval", str(run), "--seeds", "3,4", "--max-steps", "30",
               "--workers", "2", "--inference", "inline", "--corruption", "sticker-3", "--corruption-module", str(PLUGIN),
               "--out", str(tmp_path / "eval")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "eval" / "episodes").glob("*.json"))]
    assert {r["corruption"] for r in records} == {"sticker-3"} and len(records) == 2 and not any(r["failed"] for r in records)


def test_reading_a_saved_drive_config_never_imports_its_modules(tmp_path):
    """An evaluation folder from someone else may name modules: rebuilding its config imports none."""
    from nsacdrive.eval.configs import DriveConfig

    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    drive = DriveConfig(corruption_modules=[str(evil)])
    assert drive.corruption_modules == (str(evil),) and not marker.exists()


def test_the_protocol_takes_a_registered_family_on_either_side_of_the_split(tmp_path):
    """``nsacdrive protocol --corruption-module`` imports the plugin before it checks the families: the
    registered family is accepted (the command stops at the next refusal, the overlapping track sets)."""
    command = [sys.executable, "-m", "nsacdrive.cli", "protocol", str(tmp_path / "run"), "--out", str(tmp_path / "p"),
               "--development", "fog", "--test", "sticker", "--fit-seeds", "1000", "--corruption-module", str(PLUGIN)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "share seeds" in result.stderr and "sticker" not in result.stderr
    without = subprocess.run(command[:-2], capture_output=True, text=True, timeout=300)
    assert without.returncode == 2 and "shift family 'sticker'" in without.stderr
