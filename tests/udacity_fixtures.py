"""Synthetic Udacity simulator recordings written to disk (a plain module imported by the tests).

:func:`write_recording` writes ``IMG/{center,left,right}_NNNN.jpg`` (160×320 JPEGs via
``cv2.imwrite``) and ``driving_log.csv`` the way the simulator does — with or without a header,
with relative, absolute, Windows-style or foreign-machine image paths — so no test downloads
anything. Each camera image is a smooth, row-dependent picture (JPEG-friendly); tests compare
imported frames with ``cv2.imread`` of the same file, which is exact.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

CAMERAS = ("center", "left", "right")
PATH_STYLES = ("relative", "absolute", "windows", "foreign")


@dataclass(frozen=True)
class Recording:
    folder: Path
    actions: np.ndarray  # [rows, 3] steering, throttle, brake as written
    speed: np.ndarray  # [rows]
    header: bool

    def image(self, camera: str, row: int) -> Path:
        return self.folder / "IMG" / f"{camera}_{row:04d}.jpg"

    def rgb(self, camera: str, row: int) -> np.ndarray:
        return cv2.cvtColor(cv2.imread(str(self.image(camera, row))), cv2.COLOR_BGR2RGB)

    def line(self, row: int) -> int:
        """The CSV line number of data row ``row`` (1-based, the header counted)."""
        return row + 1 + int(self.header)


def jpeg_header(width: int, height: int) -> bytes:
    """The first bytes of a baseline JPEG declaring ``width``×``height`` pixels and nothing after:
    a file or message that claims a picture without holding one (no decoder makes an image of it)."""
    start_of_frame = b"\xff\xc0\x00\x11\x08" + height.to_bytes(2, "big") + width.to_bytes(2, "big") + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + start_of_frame + b"\xff\xd9"


def camera_image(row: int, camera: str) -> np.ndarray:
    """A 160×320 RGB picture: sky, a grey road trapezoid shifted per camera, colours varying by row."""
    image = np.zeros((160, 320, 3), dtype=np.uint8)
    image[:70] = (120 + row % 50, 170, 230)
    image[70:] = (60, 140 - row % 40, 60)
    shift = {"center": 0, "left": 40, "right": -40}[camera]
    ys = np.arange(70, 160)
    half = (ys - 60) * 1.5
    centre = 160 + shift + 10 * np.sin(row / 4)
    for y, h in zip(ys, half):
        lo, hi = int(max(centre - h, 0)), int(min(centre + h, 320))
        image[y, lo:hi] = (110, 110, 110)
    return image


def written_path(folder: Path, name: str, style: str) -> str:
    if style == "relative":
        return f"IMG/{name}"
    if style == "absolute":
        return str(folder / "IMG" / name)
    if style == "windows":
        return f"C:\\Users\\driver\\Desktop\\track1\\IMG\\{name}"
    if style == "foreign":
        return f"/home/somebody-else/recordings/track1/IMG/{name}"
    raise ValueError(f"path style must be one of {PATH_STYLES}, got {style!r}")


def write_recording(folder: Path, rows: int = 12, header: bool = False, paths: str = "relative",
                    side_cameras: bool = True, seed: int = 0) -> Recording:
    """Write a recording of ``rows`` rows into ``folder`` (created)."""
    folder = Path(folder)
    (folder / "IMG").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    actions = np.stack([np.round(rng.uniform(-0.5, 0.5, rows), 4), np.round(rng.uniform(0, 1, rows), 4),
                        np.round(rng.uniform(0, 0.3, rows) * (rng.random(rows) < 0.3), 4)], axis=1)
    speed = np.round(rng.uniform(0, 30, rows), 4)
    lines = [["center", "left", "right", "steering", "throttle", "brake", "speed"]] if header else []
    for row in range(rows):
        cells = []
        for camera in CAMERAS:
            if camera != "center" and not side_cameras:
                cells.append("")
                continue
            name = f"{camera}_{row:04d}.jpg"
            cv2.imwrite(str(folder / "IMG" / name), cv2.cvtColor(camera_image(row, camera), cv2.COLOR_RGB2BGR))
            # the sample data writes " IMG/left_…" with a leading space in the side columns
            cells.append((" " if camera != "center" else "") + written_path(folder, name, paths))
        lines.append([*cells, *(f"{v:g}" for v in actions[row]), f"{speed[row]:g}"])
    with open(folder / "driving_log.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return Recording(folder, actions.astype(np.float32), speed.astype(np.float32), header)


def curved_road_image(bend: float, rng: np.random.Generator) -> np.ndarray:
    """A 160×320 RGB front-camera picture of a road bending by ``bend`` (−1 hard left … +1 hard right).

    Sky above the horizon (row 60), grass with a few random darker patches (so the picture changes
    from frame to frame while the road is what tells the bend), a grey road whose centre drifts
    sideways with the square of the distance, and a dashed white centre line.
    """
    image = np.empty((160, 320, 3), dtype=np.uint8)
    image[:60] = (150, 190, 235)
    image[60:] = (70, 130 + int(rng.integers(-10, 10)), 60)
    for _ in range(4):
        y, x = int(rng.integers(70, 160)), int(rng.integers(0, 320))
        image[y:y + 12, x:x + 30] = (55, 105, 50)
    rows = np.arange(60, 160)
    near = (rows - 60) / 100.0  # 0 at the horizon, → 1 at the bonnet
    centre = 160 + 120 * bend * (1 - near) ** 2
    half = 6 + 100 * near
    for y, c, h, s in zip(rows, centre, half, near):
        lo, hi = int(max(c - h, 0)), int(min(c + h, 320))
        image[y, lo:hi] = (105, 105, 105)
        if int(s * 30) % 2 == 0:
            line = int(1 + 3 * s)
            image[y, int(c) - line:int(c) + line] = (235, 235, 235)
    return image


def write_curved_road_recording(folder: Path, rows: int = 600, seed: int = 0) -> Recording:
    """A simulator-format recording (centre camera only, no header) of a road bending left and right.

    The bend follows a smooth random curve in [−1, 1]; the steering label is 0.6 × bend (positive =
    right, as the simulator), throttle 0.3, speed ≈ 20 mph.
    """
    folder = Path(folder)
    (folder / "IMG").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    phases, periods = rng.uniform(0, 2 * np.pi, 2), rng.uniform(60, 140, 2)
    bend = np.clip(0.7 * np.sin(2 * np.pi * t / periods[0] + phases[0]) + 0.4 * np.sin(2 * np.pi * t / periods[1] + phases[1]), -1, 1)
    actions = np.stack([np.round(0.6 * bend, 4), np.full(rows, 0.3), np.zeros(rows)], axis=1)
    speed = np.round(20 + rng.normal(0, 0.5, rows), 3)
    lines = []
    for row in range(rows):
        name = f"center_{row:04d}.jpg"
        cv2.imwrite(str(folder / "IMG" / name), cv2.cvtColor(curved_road_image(float(bend[row]), rng), cv2.COLOR_RGB2BGR))
        lines.append([str(folder / "IMG" / name), "", "", *(f"{v:g}" for v in actions[row]), f"{speed[row]:g}"])
    with open(folder / "driving_log.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return Recording(folder, actions.astype(np.float32), speed.astype(np.float32), header=False)
