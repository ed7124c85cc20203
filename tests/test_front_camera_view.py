"""bench/front_camera_view.py: which failures it reads, how it measures road in a frame, the replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.front_camera_view import failures, road_share, view_at_failure
from nsacdrive.envs.colours import DEFAULT_SCHEME
from nsacdrive.envs.front_camera import CameraConfig, FrontCamera, FrontCameraPalette
from nsacdrive.eval.closed_loop import LOG_FIELDS
from nsacdrive.eval.results import EvaluationError

PALETTE = FrontCameraPalette.from_scheme(DEFAULT_SCHEME)


def test_road_share_counts_pixels_in_the_roads_shades_only():
    frame = np.empty((10, 20, 3), dtype=np.uint8)
    frame[:, :5] = np.round(PALETTE.road_shades[0])
    frame[:, 5:10] = np.round(PALETTE.road_shades[2])
    frame[:, 10:] = np.round(PALETTE.grass)
    assert road_share(frame, PALETTE) == pytest.approx(0.5)
    assert road_share(np.full_like(frame, 255), PALETTE) == 0.0


def write_episode(folder: Path, episode_id: str, lateral_error: np.ndarray | None = None, **record: object) -> None:
    """One closed-loop episode as ``nsacdrive eval`` leaves it: a JSON record and, unless it failed, its per-step log."""
    episodes = folder / "episodes"
    episodes.mkdir(parents=True, exist_ok=True)
    (episodes / f"{episode_id}.json").write_text(json.dumps({"episode_id": episode_id, "failed": False, **record}))
    if lateral_error is not None:
        steps = len(lateral_error)
        log = {name: np.zeros(steps, dtype=np.float32) for name in LOG_FIELDS}
        log["executed_action"] = np.tile(np.array([0.0, 0.3, 0.0], dtype=np.float32), (steps, 1))  # straight ahead from the start line
        log["lateral_error"] = lateral_error
        np.savez(episodes / f"{episode_id}.npz", **log)


def test_failures_reads_failed_uncorrupted_episodes_of_a_summary(tmp_path: Path):
    common = {"track_seed": 1000, "colour_preset": "default"}
    write_episode(tmp_path, "a", lap_finished=True, corruption="none", **common)
    write_episode(tmp_path, "b", lap_finished=False, corruption="none", track_seed=1001, colour_preset="shift-3")
    write_episode(tmp_path, "c", lap_finished=False, corruption="fog-3", **common)
    assert [(r["episode_id"], r["track_seed"], r["colour_preset"]) for r in failures(tmp_path)] == [("b", 1001, "shift-3")]
    with pytest.raises(EvaluationError, match="no episode records found"):
        failures(tmp_path / "missing")


def test_view_at_failure_replays_to_the_step_before_leaving_the_road(tmp_path: Path):
    lateral = np.zeros(60, dtype=np.float32)
    record = {"episode_id": "on_road", "track_seed": 1000, "colour_preset": "default"}
    write_episode(tmp_path, "on_road", lateral, lap_finished=False, corruption="none")
    cameras = {65.0: FrontCamera(CameraConfig()), 120.0: FrontCamera(CameraConfig(horizontal_fov=120.0))}
    assert view_at_failure(tmp_path, record, cameras, lateral=8.0, before=0) is None  # never left the road
    lateral[40:] = 9.0
    write_episode(tmp_path, "on_road", lateral, lap_finished=False, corruption="none")
    shares = view_at_failure(tmp_path, record, cameras, lateral=8.0, before=10)
    assert set(shares) == {65.0, 120.0}
    # on the road, looking along it: road fills a good part of either frame, and the wider view
    # (same image size) shows the same road smaller, with more grass beside it
    assert shares[65.0] > 0.1 and shares[120.0] > 0.05
    assert shares[120.0] < shares[65.0]
