"""One lossless file per episode (+ JSON sidecar): writing, reading and validating.

The ``.npz`` holds the arrays below (names follow Minari's EpisodeData where one exists:
``observations`` has one more entry than ``actions`` — the final observation). It is written
with fixed zip timestamps, so the same episode always gives byte-identical files, and
atomically (temp file + rename). The sidecar is written last: an episode exists once its
sidecar exists, and the sidecar's ``sha256`` and ``file_size`` pin the ``.npz`` it describes.

| array           | dtype   | shape          | meaning                                          |
|-----------------|---------|----------------|--------------------------------------------------|
| observations    | uint8   | (T+1, 96,96,3) | raw RGB frames, HUD included (cropped at load)   |
| actions         | float32 | (T, 3)         | executed (steer, gas, brake)                     |
| expert_actions  | float32 | (T, 3)         | the expert's label (== actions without noise)    |
| rewards         | float32 | (T,)           |                                                  |
| terminations    | bool    | (T,)           |                                                  |
| truncations     | bool    | (T,)           |                                                  |
| pose            | float32 | (T+1, 3)       | x, y, wrapped hull angle                         |
| speed           | float32 | (T+1,)         | forward speed                                    |
| lateral_error   | float32 | (T+1,)         | signed, + right of the centreline                |
| heading_error   | float32 | (T+1,)         | wrap(hull angle − track angle)                   |
| progress        | float32 | (T+1,)         | arc length of the projection on the centreline   |
| state           | float32 | (T+1, D)       | privileged state vector (nsacdrive.envs.state.STATE_FIELDS)|

Frame kinds (format version 1, extended compatibly): the sidecar field ``frame_kind`` names the
raw frames, ``carracing`` (96×96×3, the table above) or ``udacity`` (160×320×3 simulator camera
frames, :mod:`nsacdrive.envs.observation_kinds`); a sidecar without it is ``carracing``, so every older
file reads as before. Two OPTIONAL arrays, shaped and typed like ``observations``, may follow:
``left_observations`` and ``right_observations`` (the side cameras of a Udacity recording), and
with them ``left_expert_actions`` and ``right_expert_actions`` (float32, (T, 3)): a state-reading
teacher's label for the car moved onto that camera's position (``side_offset`` in the sidecar),
which training uses for that camera's frames instead of a fixed steering correction.

Imported recordings (source ``udacity-import``, :mod:`nsacdrive.data_collection.udacity_import`) have no
privileged simulator state: ``pose``, ``lateral_error``, ``heading_error``, ``progress`` and
``rewards`` are NaN, ``state`` has zero columns (T+1, 0), ``terminations`` are False and
``truncations`` True at the last step; ``actions`` = ``expert_actions`` = the logged
(steering, throttle, brake) and ``speed`` the logged speed (mph). Validation requires finite
actions only, so these episodes load, summarise and train like recorded ones.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.envs.observation import RAW_FRAME_SHAPE
from nsacdrive.envs.observation_kinds import DEFAULT_FRAME_KIND, OBSERVATION_KINDS, camera_fov_for

FORMAT_VERSION = 1
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)

#: array name → (dtype, shape pattern); "T" = steps, "T+1" = steps + 1, None = any size
EPISODE_ARRAYS: dict[str, tuple[np.dtype, tuple[object, ...]]] = {
    "observations": (np.dtype(np.uint8), ("T+1", *RAW_FRAME_SHAPE)),
    "actions": (np.dtype(np.float32), ("T", 3)),
    "expert_actions": (np.dtype(np.float32), ("T", 3)),
    "rewards": (np.dtype(np.float32), ("T",)),
    "terminations": (np.dtype(np.bool_), ("T",)),
    "truncations": (np.dtype(np.bool_), ("T",)),
    "pose": (np.dtype(np.float32), ("T+1", 3)),
    "speed": (np.dtype(np.float32), ("T+1",)),
    "lateral_error": (np.dtype(np.float32), ("T+1",)),
    "heading_error": (np.dtype(np.float32), ("T+1",)),
    "progress": (np.dtype(np.float32), ("T+1",)),
    "state": (np.dtype(np.float32), ("T+1", None)),
}
#: arrays an episode MAY carry, validated like ``observations`` when present (in this order after the others)
#: camera name → the array holding its frames
CAMERA_ARRAYS = {"center": "observations", "left": "left_observations", "right": "right_observations"}
#: side camera name → the array holding the expert's labels seen from it (optional)
CAMERA_LABEL_ARRAYS = {"left": "left_expert_actions", "right": "right_expert_actions"}
OBSERVATION_ARRAYS = tuple(CAMERA_ARRAYS.values())
OPTIONAL_ARRAYS: dict[str, tuple[np.dtype, tuple[object, ...]]] = {
    **{name: EPISODE_ARRAYS["observations"] for name in OBSERVATION_ARRAYS[1:]},
    **{name: EPISODE_ARRAYS["expert_actions"] for name in CAMERA_LABEL_ARRAYS.values()},
}
SMALL_ARRAYS = tuple(name for name in EPISODE_ARRAYS if name != "observations")
SIDECAR_FIELDS = ("format_version", "episode_id", "file", "n_steps", "track_seed", "colour_preset",
                  "colour_scheme", "source", "agent", "sha256", "file_size")


class EpisodeFileError(ValueError):
    """A problem with one episode file; the message names the file and what was expected."""


@dataclass(frozen=True)
class EpisodePaths:
    data: Path
    sidecar: Path

    @classmethod
    def for_id(cls, folder: Path, episode_id: str) -> "EpisodePaths":
        return cls(folder / f"{episode_id}.npz", folder / f"{episode_id}.json")


def _expected_shape(pattern: tuple[object, ...], n_steps: int, actual: tuple[int, ...]) -> tuple[int, ...]:
    sizes = {"T": n_steps, "T+1": n_steps + 1}
    return tuple(actual[i] if p is None else sizes.get(p, p) for i, p in enumerate(pattern))  # type: ignore[misc]


def check_array(name: str, array_dtype: np.dtype, shape: tuple[int, ...], n_steps: int, where: Path,
                frame_kind: str = DEFAULT_FRAME_KIND) -> None:
    """Raise EpisodeFileError unless ``name`` has the dtype and shape the format prescribes
    (observation arrays: the raw frame shape of ``frame_kind``)."""
    dtype, pattern = {**EPISODE_ARRAYS, **OPTIONAL_ARRAYS}[name]
    if name in OBSERVATION_ARRAYS:
        pattern = ("T+1", *OBSERVATION_KINDS[frame_kind].raw_shape)
    if array_dtype != dtype:
        raise EpisodeFileError(f"{where}: array '{name}' has dtype {array_dtype}, expected {dtype}")
    expected = _expected_shape(pattern, n_steps, shape) if len(shape) == len(pattern) else None
    if expected is None or tuple(shape) != expected:
        raise EpisodeFileError(f"{where}: array '{name}' has shape {tuple(shape)}, expected {pattern} with T={n_steps}")


def encode_episode(arrays: dict[str, np.ndarray]) -> bytes:
    """Deterministic compressed npz bytes (fixed member order and zip timestamps)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for name in [*EPISODE_ARRAYS, *(name for name in OPTIONAL_ARRAYS if name in arrays)]:
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
    return buffer.getvalue()


def write_episode(folder: Path, episode_id: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> dict[str, Any]:
    """Validate, then write ``<id>.npz`` and ``<id>.json`` atomically; returns the sidecar."""
    paths = EpisodePaths.for_id(Path(folder), episode_id)
    missing = set(EPISODE_ARRAYS) - set(arrays)
    if missing:
        raise EpisodeFileError(f"{paths.data}: episode lacks arrays {sorted(missing)}")
    unknown = set(arrays) - set(EPISODE_ARRAYS) - set(OPTIONAL_ARRAYS)
    if unknown:
        raise EpisodeFileError(f"{paths.data}: unknown arrays {sorted(unknown)}; optional arrays are {list(OPTIONAL_ARRAYS)}")
    frame_kind = metadata.get("frame_kind", DEFAULT_FRAME_KIND)
    _check_frame_kind(frame_kind, paths.sidecar)
    n_steps = int(len(arrays["actions"]))
    for name in arrays:
        check_array(name, arrays[name].dtype, arrays[name].shape, n_steps, paths.data, frame_kind)
    payload = encode_episode(arrays)
    atomic_write_bytes(paths.data, payload)
    sidecar = {
        **metadata,
        "format_version": FORMAT_VERSION,
        "frame_kind": frame_kind,
        "episode_id": episode_id,
        "file": paths.data.name,
        "n_steps": n_steps,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "file_size": len(payload),
    }
    atomic_write_json(paths.sidecar, sidecar)
    return sidecar


def _check_frame_kind(frame_kind: object, where: Path) -> None:
    if frame_kind not in OBSERVATION_KINDS:
        raise EpisodeFileError(f"{where}: sidecar field 'frame_kind' must be one of {list(OBSERVATION_KINDS)}, got {frame_kind!r}")


def frame_kind_of(sidecar: dict[str, Any]) -> str:
    """The raw frame kind of an episode (sidecars written before the field existed: ``carracing``)."""
    return sidecar.get("frame_kind", DEFAULT_FRAME_KIND)


def camera_fov_of(sidecar: dict[str, Any]) -> float | None:
    """The front camera's horizontal field of view of a ``udacity`` episode (absent: the
    simulator's default); None for frames without a front camera."""
    return camera_fov_for(frame_kind_of(sidecar), sidecar.get("camera_fov"), "sidecar field 'camera_fov'")


def read_sidecar(path: Path) -> dict[str, Any]:
    """Parse and check a sidecar; EpisodeFileError names the file and the missing field."""
    try:
        sidecar = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise EpisodeFileError(f"{path}: sidecar file is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EpisodeFileError(f"{path}: sidecar is not valid JSON ({exc})") from None
    if not isinstance(sidecar, dict):
        raise EpisodeFileError(f"{path}: sidecar must be a JSON object")
    missing = [f for f in SIDECAR_FIELDS if f not in sidecar]
    if missing:
        raise EpisodeFileError(f"{path}: sidecar lacks fields {missing}")
    if sidecar["format_version"] != FORMAT_VERSION:
        raise EpisodeFileError(f"{path}: format_version {sidecar['format_version']}, this reader expects {FORMAT_VERSION}")
    for name in ("n_steps", "track_seed", "file_size"):
        value = sidecar[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise EpisodeFileError(f"{path}: sidecar field '{name}' must be a non-negative integer, got {value!r}")
    file_name = sidecar["file"]
    if not isinstance(file_name, str) or Path(file_name).name != file_name or not file_name.endswith(".npz"):
        raise EpisodeFileError(f"{path}: sidecar field 'file' must be an .npz file name in the same folder, got {file_name!r}")
    if not isinstance(sidecar["sha256"], str):
        raise EpisodeFileError(f"{path}: sidecar field 'sha256' must be a hex string, got {sidecar['sha256']!r}")
    _check_frame_kind(frame_kind_of(sidecar), path)
    return sidecar


def _open_archive(data_path: Path, sidecar: dict[str, Any]) -> zipfile.ZipFile:
    try:
        payload = data_path.read_bytes()
    except FileNotFoundError:
        raise EpisodeFileError(f"{data_path}: episode file is missing (named by its sidecar)") from None
    if len(payload) != sidecar["file_size"]:
        raise EpisodeFileError(f"{data_path}: file has {len(payload)} bytes, sidecar says {sidecar['file_size']} (truncated or replaced)")
    if hashlib.sha256(payload).hexdigest() != sidecar["sha256"]:
        raise EpisodeFileError(f"{data_path}: sha256 differs from the sidecar's (corrupt or replaced file)")
    try:
        return zipfile.ZipFile(io.BytesIO(payload))
    except zipfile.BadZipFile as exc:
        raise EpisodeFileError(f"{data_path}: not a readable npz archive ({exc})") from None


def _read_member(archive: zipfile.ZipFile, name: str, data_path: Path) -> np.ndarray:
    try:
        with archive.open(f"{name}.npy") as member:
            return np.lib.format.read_array(member, allow_pickle=False)
    except KeyError:
        raise EpisodeFileError(f"{data_path}: array '{name}' is missing") from None
    except (ValueError, zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
        raise EpisodeFileError(f"{data_path}: array '{name}' cannot be decoded ({exc})") from None


def _observation_header(archive: zipfile.ZipFile, name: str, data_path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of an observation array from its npy header alone (no pixels decoded)."""
    try:
        with archive.open(f"{name}.npy") as member:
            version = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)
    except KeyError:
        raise EpisodeFileError(f"{data_path}: array '{name}' is missing") from None
    except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise EpisodeFileError(f"{data_path}: array '{name}' has an unreadable header ({exc})") from None
    return tuple(shape), np.dtype(dtype)


def load_episode_arrays(sidecar_path: Path, include_observations: bool = True,
                        side_cameras: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and fully validate one episode: sidecar, checksum, dtypes, shapes, finite actions.

    ``include_observations=False`` checks the frame arrays' headers without decoding pixels;
    ``side_cameras=False`` leaves the optional side-camera arrays undecoded (headers still checked).
    """
    sidecar_path = Path(sidecar_path)
    sidecar = read_sidecar(sidecar_path)
    data_path = sidecar_path.parent / sidecar["file"]
    n_steps = int(sidecar["n_steps"])
    frame_kind = frame_kind_of(sidecar)
    with _open_archive(data_path, sidecar) as archive:
        arrays = {name: _read_member(archive, name, data_path) for name in SMALL_ARRAYS}
        members = set(archive.namelist())
        frames = ["observations", *(name for name in OBSERVATION_ARRAYS[1:] if f"{name}.npy" in members)]
        side_labels = [name for name in CAMERA_LABEL_ARRAYS.values() if f"{name}.npy" in members]
        arrays |= {name: _read_member(archive, name, data_path) for name in side_labels}
        decode = {"observations", *(OBSERVATION_ARRAYS if side_cameras else ())} if include_observations else set()
        frame_headers = {}
        for name in frames:
            if name in decode:
                arrays[name] = _read_member(archive, name, data_path)
                frame_headers[name] = (arrays[name].shape, arrays[name].dtype)
            else:
                frame_headers[name] = _observation_header(archive, name, data_path)
    if len(arrays["actions"]) != n_steps:
        raise EpisodeFileError(f"{data_path}: {len(arrays['actions'])} actions but the sidecar says n_steps={n_steps}")
    for name, (shape, dtype) in frame_headers.items():
        check_array(name, dtype, shape, n_steps, data_path, frame_kind)
    for name in [*SMALL_ARRAYS, *side_labels]:
        check_array(name, arrays[name].dtype, arrays[name].shape, n_steps, data_path)
    for name in ("actions", "expert_actions", *side_labels):
        bad = ~np.isfinite(arrays[name])
        if bad.any():
            step = int(np.argwhere(bad)[0][0])
            raise EpisodeFileError(f"{data_path}: array '{name}' holds NaN/inf (first at step {step})")
    return sidecar, arrays
