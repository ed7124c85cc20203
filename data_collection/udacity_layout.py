"""Write recorded episodes in the Udacity simulator's recording layout, so Udacity tools read them.

Layout of a folder, as the simulator's own recordings:

* ``IMG/center_<episode id>_<step>.jpg`` (and ``left_…``, ``right_…``): 320×160 RGB JPEGs;
* ``driving_log.csv``: one row per step, NO header, 7 columns ``center, left, right, steering,
  throttle, brake, speed`` with ABSOLUTE image paths (like a self-recorded log; moving the
  folder breaks them, as it does for the simulator's).

Row t holds the three camera frames of step t (the state the agent saw) and that step's action.

Mapping from CarRacing (both use "positive steers right", so no sign flip):

| column   | value                                         | range                        |
|----------|-----------------------------------------------|------------------------------|
| steering | the agent's steer label (``expert_actions``)  | [−1, 1], > 0 right (Udacity: the wheel angle / 25°, > 0 right) |
| throttle | its gas                                       | [0, 1]                       |
| brake    | its brake                                     | [0, 1]                       |
| speed    | abs(forward speed) × 2.23694 (units/s → mph)  | ≥ 0, mph as the simulator logs it |

The labels are the agent's own action, which equals the executed one unless ``--noise`` is
given (then the images show the perturbed drive and the log the correcting label, as a DART
dataset should). Speed: one world unit is taken as one metre (the CarRacing hull is 5 × 2.4
units), so the expert's 60–140 units/s are 130–310 "mph" — far above the simulator's 30 mph
cap: CarRacing cars are fast for their size.

Resumability: each episode writes its JPEGs, then ``episodes/<id>.csv`` (its rows) and last
``episodes/<id>.json`` (sidecar: the episode metadata + the rows' sha256), both atomically; an
episode is complete once its sidecar pins its rows. ``driving_log.csv`` is rebuilt atomically
from the complete episodes' rows (sorted by id) after every episode, like ``manifest.json``.
The same episode always gives the same bytes (fixed JPEG quality, deterministic frames).

Reading frames back (the importer, the simulator server): :func:`declared_frame_size` reads the
width and height a JPEG or PNG declares in its header, so a file or message claiming a huge
picture is refused before anything decodes it; :data:`MAX_FRAME_BYTES` bounds a frame's bytes.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json, remove_partial_files
from nsacdrive.data_collection.episode import CAMERA_ARRAYS
from nsacdrive.envs.udacity_observation import JPEG_QUALITY, UDACITY_RAW_FRAME_SHAPE, encode_jpeg

IMG_DIR = "IMG"
EPISODES_DIR = "episodes"
LOG_NAME = "driving_log.csv"
MPH_PER_UNIT_PER_SECOND = 2.2369362920544  # 1 world unit = 1 m; m/s → mph
#: (width, height) of a camera frame, as image headers declare it.
FRAME_SIZE = (UDACITY_RAW_FRAME_SHAPE[1], UDACITY_RAW_FRAME_SHAPE[0])
#: Most bytes a camera frame file or message may have: three times an uncompressed 320×160 RGB frame.
MAX_FRAME_BYTES = 3 * UDACITY_RAW_FRAME_SHAPE[0] * UDACITY_RAW_FRAME_SHAPE[1] * UDACITY_RAW_FRAME_SHAPE[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: JPEG start-of-frame markers (SOF0–SOF15 but DHT C4, JPG C8 and DAC CC): their segment holds the size.
JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
JPEG_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0–7: no length field


def declared_frame_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) declared by a JPEG's start-of-frame or a PNG's IHDR header; None when
    ``data`` is neither or declares no size before its image data. Nothing is decoded."""
    if data.startswith(PNG_SIGNATURE):
        if data[12:16] != b"IHDR" or len(data) < 24:
            return None
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return _jpeg_size(data) if data.startswith(b"\xff\xd8") else None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk a JPEG's marker segments up to its first start-of-frame (see :func:`declared_frame_size`)."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF or marker in JPEG_STANDALONE_MARKERS:  # a fill byte, or a marker without a length
            at += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if marker in JPEG_SOF_MARKERS:
            segment = data[at + 4:at + 9]  # precision, height, width
            return (int.from_bytes(segment[3:5], "big"), int.from_bytes(segment[1:3], "big")) if len(segment) == 5 else None
        if length < 2 or marker in (0xD9, 0xDA):  # a broken length, end of image or start of scan before any frame
            return None
        at += 2 + length
    return None


def _number(value: float) -> str:
    return f"{float(value):.6g}"


def _paths(folder: Path, episode_id: str) -> tuple[Path, Path]:
    return folder / EPISODES_DIR / f"{episode_id}.csv", folder / EPISODES_DIR / f"{episode_id}.json"


def write_udacity_episode(folder: Path, episode_id: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> dict[str, Any]:
    """Write one episode's JPEGs and rows (see the module docstring); returns its sidecar."""
    folder = Path(folder).resolve()
    missing = [name for name in CAMERA_ARRAYS.values() if name not in arrays]
    if missing:
        raise ValueError(f"the Udacity layout needs all three cameras; episode {episode_id} lacks {missing}")
    images = folder / IMG_DIR
    images.mkdir(parents=True, exist_ok=True)
    n_steps = len(arrays["actions"])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for t in range(n_steps):
        paths = []
        for camera, name in CAMERA_ARRAYS.items():
            path = images / f"{camera}_{episode_id}_{t:06d}.jpg"
            path.write_bytes(encode_jpeg(arrays[name][t]))
            paths.append(str(path))
        steer, gas, brake = arrays["expert_actions"][t]
        speed = abs(float(arrays["speed"][t])) * MPH_PER_UNIT_PER_SECOND
        writer.writerow([*paths, _number(steer), _number(gas), _number(brake), _number(speed)])
    rows = buffer.getvalue().encode()
    log_path, sidecar_path = _paths(folder, episode_id)
    atomic_write_bytes(log_path, rows)
    sidecar = {
        **metadata,
        "episode_id": episode_id,
        "layout": "udacity",
        "log": log_path.name,
        "log_sha256": hashlib.sha256(rows).hexdigest(),
        "n_steps": n_steps,
        "jpeg_quality": JPEG_QUALITY,
        "speed_units": "mph",
    }
    atomic_write_json(sidecar_path, sidecar)
    return sidecar


def _complete_rows(folder: Path, episode_id: str) -> bytes | None:
    """The episode's log rows when its sidecar parses and pins them, else None (read once)."""
    log_path, sidecar_path = _paths(Path(folder), episode_id)
    try:
        sidecar = json.loads(sidecar_path.read_text())
        rows = log_path.read_bytes()
    except (OSError, ValueError):
        return None
    return rows if isinstance(sidecar, dict) and hashlib.sha256(rows).hexdigest() == sidecar.get("log_sha256") else None


def udacity_episode_is_complete(folder: Path, episode_id: str) -> bool:
    """True when the episode's sidecar parses and pins the rows file beside it."""
    return _complete_rows(folder, episode_id) is not None


def write_driving_log(folder: Path) -> int:
    """Rebuild ``driving_log.csv`` from every complete episode (sorted by id); returns its rows."""
    folder = Path(folder)
    parts = sorted(p.stem for p in (folder / EPISODES_DIR).glob("*.json") if not p.name.startswith("."))
    rows = b"".join(filter(None, (_complete_rows(folder, episode_id) for episode_id in parts)))
    atomic_write_bytes(folder / LOG_NAME, rows)
    return rows.count(b"\n")


def prepare_udacity_folder(folder: Path) -> None:
    """Create the layout's folders and delete leftovers of interrupted atomic writes."""
    (Path(folder) / EPISODES_DIR).mkdir(parents=True, exist_ok=True)
    remove_udacity_leftovers(folder)


def remove_udacity_leftovers(folder: Path) -> None:
    """Delete the temporary files of atomic writes that never finished (log, rows, sidecars)."""
    for part in (Path(folder), Path(folder) / EPISODES_DIR):
        remove_partial_files(part)
