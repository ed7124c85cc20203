"""Synthetic track centrelines shared by the geometry, state and expert tests."""

from __future__ import annotations

import numpy as np

from nsacdrive.envs.geometry import TrackGeometry


def densified_rectangle(width: float = 200.0, height: float = 20.0, step: float = 1.0) -> TrackGeometry:
    """A counter-clockwise rectangle (+x along y=0 first) with a vertex every ``step`` units, so it
    turns only at its 4 corners."""
    corners = np.array([[0.0, 0.0], [width, 0.0], [width, height], [0.0, height]])
    points = []
    for a, b in zip(corners, np.roll(corners, -1, axis=0)):
        n = int(round(np.hypot(*(b - a)) / step))
        points.extend(a + (b - a) * k / n for k in range(n))
    return TrackGeometry(np.array(points))
