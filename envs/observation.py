"""The ONE observation preprocessing path shared by training, offline and closed-loop evaluation.

Decision: the HUD (bottom 12 rows: speed, ABS, steering and gyro bars, score) is CROPPED, not
masked. A cloned policy can otherwise read its previous steering off the HUD bar (the copycat
shortcut), and cropping also avoids spending convolutions on a constant black band.
Episode files store the raw 96×96 frames losslessly; everything that feeds a network calls
:func:`preprocess_observation`.
"""

from __future__ import annotations

import numpy as np

RAW_FRAME_SHAPE = (96, 96, 3)
HUD_ROWS = 12
PREPROCESSED_FRAME_SHAPE = (3, RAW_FRAME_SHAPE[0] - HUD_ROWS, RAW_FRAME_SHAPE[1])  # (C, H, W)
PREPROCESS_VERSION = "crop-hud12-chw-unit-v1"


def encode_observation(frames: np.ndarray) -> np.ndarray:
    """Raw uint8 RGB frames (..., 96, 96, 3) → uint8 (..., 3, 84, 96), HUD cropped, channels first.

    The network's layout before scaling: what datasets store and batches carry (a quarter of the
    bytes of float32), scaled to [0, 1] on the model's device. Works on one frame, a sequence or
    a batch of sequences: only the last three axes are touched.
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise TypeError(f"preprocess_observation expects uint8 frames, got dtype {frames.dtype}")
    if frames.ndim < 3 or frames.shape[-3:] != RAW_FRAME_SHAPE:
        raise ValueError(
            f"preprocess_observation expects frames of shape (..., 96, 96, 3), got {frames.shape}"
        )
    cropped = frames[..., : RAW_FRAME_SHAPE[0] - HUD_ROWS, :, :]
    return np.ascontiguousarray(np.moveaxis(cropped, -1, -3))


def preprocess_observation(frames: np.ndarray) -> np.ndarray:
    """Raw uint8 RGB frames (..., 96, 96, 3) → float32 (..., 3, 84, 96) in [0, 1], HUD cropped:
    :func:`encode_observation` scaled by 1/255. Colour perturbations must be applied BEFORE this
    call (in RGB)."""
    out = encode_observation(frames).astype(np.float32) / np.float32(255.0)
    assert out.shape[-3:] == PREPROCESSED_FRAME_SHAPE
    return out
