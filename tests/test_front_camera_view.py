"""bench/front_camera_view.py: which failures it reads, how it measures road in a frame, the replay."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from bench.front_camera_view import Failure, failures, road_share, view_at_failure
from nsacdrive.envs.colours import DEFAULT_SCHEME
from nsacdrive.envs.front_camera import CameraConfig, FrontCamera, FrontCameraPalette

PALETTE = FrontCameraPalette.from_scheme(DEFAULT_SCHEME)


def test_road_share_counts_pixels_in_the_roads_shades_only():
    frame = np.empty((10, 20, 3), dtype=np.uint8)
    frame[:, :5] = np.round(PALETTE.road_shades[0])
    frame[:, 5:10] = np.round(PALETTE.road_shades[2])
    frame[:, 10:] = np.round(PALETTE.grass)
    assert road_share(frame, PALETTE) == pytest.approx(0.5)
    assert road_share(np.full_like(frame, 255), PALETTE) == 0.0


def test_failures_reads_failed_uncorrupted_episodes_of_a_summary(tmp_path: Path):
    fields = ["episode_id", "lap_finished", "corruption", "track_seed", "colour_preset"]
    rows = [("a", "True", "none", 1000, "default"), ("b", "False", "none", 1001, "shift-3"),
            ("c", "False", "fog-3", 1002, "default")]
    with (tmp_path / "summary.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        writer.writerows(rows)
    assert failures(tmp_path) == [Failure(tmp_path / "episodes" / "b.npz", 1001, "shift-3")]
    with pytest.raises(FileNotFoundError, match="no summary.csv"):
        failures(tmp_path / "missing")


def test_view_at_failure_replays_to_the_step_before_leaving_the_road(tmp_path: Path):
    steps = 60
    actions = np.tile(np.array([0.0, 0.3, 0.0], dtype=np.float32), (steps, 1))  # straight ahead from the start line
    lateral = np.zeros(steps, dtype=np.float32)
    episode = tmp_path / "on_road.npz"
    np.savez(episode, executed_action=actions, lateral_error=lateral)
    cameras = {65.0: FrontCamera(CameraConfig()), 120.0: FrontCamera(CameraConfig(horizontal_fov=120.0))}
    failure = Failure(episode, track_seed=1000, colour_preset="default")
    assert view_at_failure(failure, cameras, lateral=8.0, before=0) is None  # never left the road
    lateral[40:] = 9.0
    np.savez(episode, executed_action=actions, lateral_error=lateral)
    shares = view_at_failure(failure, cameras, lateral=8.0, before=10)
    assert set(shares) == {65.0, 120.0}
    # on the road, looking along it: road fills a good part of either frame, and the wider view
    # (same image size) shows the same road smaller, with more grass beside it
    assert shares[65.0] > 0.1 and shares[120.0] > 0.05
    assert shares[120.0] < shares[65.0]
