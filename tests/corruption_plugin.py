"""A corruption family registered from outside the package, as a user's module would: a dark
sticker on the lens whose place is drawn once per episode (``--corruption-module`` imports this)."""

from __future__ import annotations

import numpy as np

from nsacdrive.envs.corruptions import register_corruption


def sticker(frame: np.ndarray, size: float, rng: np.random.Generator) -> np.ndarray:
    """A black square of ``size`` × the frame's height at a place drawn from ``rng``."""
    height, width = frame.shape[:2]
    side = max(1, int(size * height))
    top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
    out = frame.copy()
    out[top:top + side, left:left + side] = 0
    return out


register_corruption("sticker", sticker, (0.05, 0.1, 0.15, 0.2, 0.3), "a sticker on the lens, in one place per episode",
                    unit="side (share of height)", per_episode=True)
