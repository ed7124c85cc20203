"""The Udacity-simulator observation transform (docs/driving.md#udacity-preprocessing), the twin of :mod:`nsacdrive.envs.observation`.

A camera frame is 160×320 RGB (the simulator's JPEGs, decoded to uint8 RGB). The network sees
the Shibuya/NVIDIA preprocessing: rows 60 … H−25 (sky and bonnet removed), resized to 200×66
with AREA interpolation, converted RGB → YUV and scaled to [−1, 1] as x / 127.5 − 1, channels
first. The widely copied script passes ``cv2.INTER_AREA`` as ``cv2.resize``'s third POSITIONAL
argument (``dst``), so it silently gets the default bilinear filter; here it is passed as
``interpolation=``. Augmentation (training only) works on the raw frames before this call
(:mod:`nsacdrive.controllers.udacity_augment`).
"""

from __future__ import annotations

import cv2
import numpy as np

UDACITY_RAW_FRAME_SHAPE = (160, 320, 3)  # (H, W, C) of a simulator camera frame
CROP_TOP = 60
CROP_BOTTOM = 25
UDACITY_CROP_ROWS = slice(CROP_TOP, UDACITY_RAW_FRAME_SHAPE[0] - CROP_BOTTOM)  # the rows the network sees
UDACITY_RESIZED = (200, 66)  # (width, height) as cv2.resize takes it
UDACITY_FRAME_SHAPE = (3, UDACITY_RESIZED[1], UDACITY_RESIZED[0])  # (C, H, W) the network sees
UDACITY_PREPROCESS_VERSION = "crop60-25-area200x66-yuv-pm1-v1"
JPEG_QUALITY = 90  # the simulator's camera images and our Udacity-layout recordings


def encode_udacity(frames: np.ndarray) -> np.ndarray:
    """Raw uint8 RGB frames (..., 160, 320, 3) → uint8 YUV (..., 3, 66, 200): cropped, resized,
    converted, channels first — the network's layout before scaling (what datasets store).

    Works on one frame, a sequence or a batch of sequences: only the last three axes are touched.
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise TypeError(f"preprocess_udacity expects uint8 frames, got dtype {frames.dtype}")
    if frames.ndim < 3 or frames.shape[-3:] != UDACITY_RAW_FRAME_SHAPE:
        raise ValueError(f"preprocess_udacity expects frames of shape (..., 160, 320, 3), got {frames.shape}")
    flat = frames.reshape(-1, *UDACITY_RAW_FRAME_SHAPE)
    out = np.empty((len(flat), *UDACITY_FRAME_SHAPE), dtype=np.uint8)
    for i, frame in enumerate(flat):
        cropped = frame[UDACITY_CROP_ROWS]
        resized = cv2.resize(cropped, UDACITY_RESIZED, interpolation=cv2.INTER_AREA)
        out[i] = np.moveaxis(cv2.cvtColor(resized, cv2.COLOR_RGB2YUV), -1, 0)
    return out.reshape(*frames.shape[:-3], *UDACITY_FRAME_SHAPE)


def preprocess_udacity(frames: np.ndarray) -> np.ndarray:
    """Raw uint8 RGB frames (..., 160, 320, 3) → float32 YUV (..., 3, 66, 200) in [−1, 1]:
    :func:`encode_udacity` scaled as x / 127.5 − 1."""
    return encode_udacity(frames).astype(np.float32) / np.float32(127.5) - np.float32(1.0)


def encode_jpeg(frame: np.ndarray) -> bytes:
    """JPEG bytes of one uint8 RGB frame (fixed quality, so the bytes are deterministic)."""
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(frame[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise ValueError(f"JPEG encoding failed for a frame of shape {frame.shape}")
    return encoded.tobytes()
