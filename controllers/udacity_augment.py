"""Training-time augmentation of Udacity camera sequences (docs/driving.md#udacity-augmentation), on raw uint8 RGB frames.

Each step is applied with probability ``probability`` (0.6), independently, in this order, with
ONE set of parameters for all T frames of a sequence (a sequence stays one consistent drive):

1. camera: one of the recorded cameras, uniformly (centre, left, right); the side cameras see
   the road as if the car were off to that side, so the label steers back: left +0.2, right −0.2,
   or, where the episode carries that camera's own labels (the front-camera simulator's expert
   labels the car moved onto each side camera), those labels;
2. horizontal flip: the steering is negated;
3. translation by (tx, ty) ~ U(±50) × U(±5) pixels (borders black); steering += 0.002 · tx;
4. shadow: the pixels on one side of a random line from the top to the bottom edge get their
   HLS lightness scaled by U(0.2, 0.5);
5. brightness: every pixel × U(0.8, 1.2), computed in float and clipped to [0, 255] BEFORE the
   cast to uint8 (the widely copied script casts first, so bright pixels wrap round to dark).

The steering labels (the whole sequence's, column 0) follow the geometric steps and are finally
clipped to the action box [−1, 1]; throttle and brake are unchanged. Randomness comes only from
the generator passed in (the trainer seeds one per sample from the run seed, epoch and sample
index), so the same seed gives the same augmented data.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from nsacdrive.common.config_checks import NON_NEGATIVE, UNIT_INTERVAL, check_fields

CAMERA_STEER_OFFSETS = {"center": 0.0, "left": 1.0, "right": -1.0}  # × camera_offset


#: the numbers UdacityAugmentConfig's fields (each end of the pairs too) may take
UDACITY_AUGMENT_RANGES = {"probability": UNIT_INTERVAL, **dict.fromkeys(
    ("camera_offset", "translate_x", "translate_y", "steer_per_pixel", "shadow_lightness", "brightness"), NON_NEGATIVE)}


@dataclass(frozen=True)
class UdacityAugmentConfig:
    """``probability`` of each step; 0 disables augmentation (validation never augments)."""

    probability: float = 0.6
    camera_offset: float = 0.2
    translate_x: float = 50.0  # max |tx|, pixels
    translate_y: float = 5.0  # max |ty|, pixels
    steer_per_pixel: float = 0.002
    shadow_lightness: tuple[float, float] = (0.2, 0.5)
    brightness: tuple[float, float] = (0.8, 1.2)

    def __post_init__(self) -> None:
        check_fields(self, "udacity_augment", UDACITY_AUGMENT_RANGES)
        for name in ("shadow_lightness", "brightness"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"udacity_augment {name} must be a range [low, high] with 0 <= low <= high, got {getattr(self, name)}")


def mirror(frames: np.ndarray) -> np.ndarray:
    """Frames (T, H, W, 3) flipped left to right, as a new contiguous array (one OpenCV call a
    frame: copying numpy's reversed view is several times slower)."""
    out = np.empty(frames.shape, dtype=frames.dtype)
    for frame, flipped in zip(frames, out, strict=True):
        cv2.flip(frame, 1, dst=flipped)
    return out


def translate(frames: np.ndarray, tx: float, ty: float) -> np.ndarray:
    """Frames (T, H, W, 3) shifted right by ``tx`` and down by ``ty`` pixels, black borders."""
    height, width = frames.shape[1:3]
    matrix = np.float32([[1, 0, tx], [0, 1, ty]])
    return np.stack([cv2.warpAffine(f, matrix, (width, height), borderMode=cv2.BORDER_CONSTANT, borderValue=0)
                     for f in frames])


def row_block(height: int, rows: slice) -> slice:
    """``rows`` of a frame ``height`` rows tall as explicit bounds; one block of rows (no step), so
    each frame's rows stay one contiguous block that OpenCV can write into."""
    kept = range(height)[rows]
    if kept.step != 1:
        raise ValueError(f"udacity_augment rows must be a slice without a step, got {rows}")
    return slice(kept.start, kept.stop)


def shadow(frames: np.ndarray, top_x: float, bottom_x: float, left_side: bool, lightness: float,
           rows: slice = slice(None)) -> np.ndarray:
    """Frames (T, H, W, 3) with HLS lightness × ``lightness`` on one side of the line from
    (``top_x``, 0) to (``bottom_x``, H), in ``rows`` only (the others are copied unchanged)."""
    height, width = frames.shape[1:3]
    kept = row_block(height, rows)
    ys, xs = np.mgrid[kept, 0:width]
    line_x = top_x + (bottom_x - top_x) * ys / height
    mask = (xs < line_x) if left_side else (xs >= line_x)
    darker = (np.arange(256) * lightness).astype(np.uint8)  # what (level × lightness).astype(uint8) gives each level
    out = np.array(frames)
    for frame in out[:, kept]:
        hls = cv2.cvtColor(frame, cv2.COLOR_RGB2HLS)
        np.copyto(hls[..., 1], darker[hls[..., 1]], where=mask)
        cv2.cvtColor(hls, cv2.COLOR_HLS2RGB, dst=frame)
    return out


def scale_brightness(frames: np.ndarray, factor: float, rows: slice = slice(None)) -> np.ndarray:
    """uint8 frames × ``factor``, rounded and clipped to [0, 255] before the cast (never wraps), in
    ``rows`` only (the others are copied unchanged). One look-up per pixel: each of the 256 levels
    is scaled once, in float32 as a per-pixel product would be."""
    table = np.clip(np.rint(np.arange(256, dtype=np.float32) * np.float32(factor)), 0, 255).astype(np.uint8)
    out = np.array(frames)
    for frame in out[:, row_block(frames.shape[1], rows)]:
        cv2.LUT(frame, table, dst=frame)
    return out


def augment_sequence(cameras: dict[str, np.ndarray], actions: np.ndarray, rng: np.random.Generator,
                     config: UdacityAugmentConfig, camera_actions: dict[str, np.ndarray] | None = None,
                     rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
    """One augmented sequence: ``cameras`` maps recorded camera names (``center`` always; ``left``,
    ``right`` when recorded) to raw frames (T, 160, 320, 3); ``actions`` (T, 3) are the labels.
    ``camera_actions`` (side camera → its own labels (T, 3), e.g. the privileged expert's for the
    car moved onto that camera) replace ``actions`` and the fixed correction when that camera is drawn.
    ``rows``: the rows the caller keeps (the trainer: the network's crop, ``UDACITY_CROP_ROWS``);
    the per-pixel steps (shadow, brightness) skip the others, so only these rows are augmented.
    Returns new frames (T, 160, 320, 3) uint8 and labels (T, 3) float32."""
    if "center" not in cameras:
        raise ValueError(f"augment_sequence needs the center camera, got {sorted(cameras)}")
    unknown = set(cameras) - set(CAMERA_STEER_OFFSETS)
    if unknown:
        raise ValueError(f"augment_sequence: unknown cameras {sorted(unknown)}; expected {list(CAMERA_STEER_OFFSETS)}")
    p = config.probability
    frames, steer = cameras["center"], actions[:, 0].astype(np.float64)
    if rng.random() < p:
        names = [name for name in CAMERA_STEER_OFFSETS if name in cameras]
        camera = names[int(rng.integers(len(names)))]
        frames = cameras[camera]
        if camera_actions and camera in camera_actions:
            actions = camera_actions[camera]
            steer = actions[:, 0].astype(np.float64)
        else:
            steer = steer + CAMERA_STEER_OFFSETS[camera] * config.camera_offset
    if rng.random() < p:
        frames, steer = mirror(frames), -steer
    if rng.random() < p:
        tx, ty = rng.uniform(-config.translate_x, config.translate_x), rng.uniform(-config.translate_y, config.translate_y)
        if tx or ty:  # a zero shift is the identity (the warp's output equals its input)
            frames = translate(frames, tx, ty)
        steer = steer + config.steer_per_pixel * tx
    if rng.random() < p:
        width = frames.shape[2]
        top_x, bottom_x = rng.uniform(0, width, 2)
        frames = shadow(frames, top_x, bottom_x, bool(rng.integers(2)), rng.uniform(*config.shadow_lightness), rows)
    if rng.random() < p:
        frames = scale_brightness(frames, rng.uniform(*config.brightness), rows)
    labels = np.array(actions, dtype=np.float32, copy=True)
    labels[:, 0] = np.clip(steer, -1.0, 1.0)
    return np.ascontiguousarray(frames, dtype=np.uint8), labels
