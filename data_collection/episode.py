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
| state           | float32 | (T+1, D)       | privileged state vector (envs.state.STATE_FIELDS)|
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

from envs.observation import RAW_FRAME_SHAPE
from nsacdrive.atomic import atomic_write_bytes, atomic_write_json

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


def check_array(name: str, array_dtype: np.dtype, shape: tuple[int, ...], n_steps: int, where: Path) -> None:
    """Raise EpisodeFileError unless ``name`` has the dtype and shape the format prescribes."""
    dtype, pattern = EPISODE_ARRAYS[name]
    if array_dtype != dtype:
        raise EpisodeFileError(f"{where}: array '{name}' has dtype {array_dtype}, expected {dtype}")
    expected = _expected_shape(pattern, n_steps, shape) if len(shape) == len(pattern) else None
    if expected is None or tuple(shape) != expected:
        raise EpisodeFileError(f"{where}: array '{name}' has shape {tuple(shape)}, expected {pattern} with T={n_steps}")


def encode_episode(arrays: dict[str, np.ndarray]) -> bytes:
    """Deterministic compressed npz bytes (fixed member order and zip timestamps)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for name in EPISODE_ARRAYS:
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
    n_steps = int(len(arrays["actions"]))
    for name in EPISODE_ARRAYS:
        check_array(name, arrays[name].dtype, arrays[name].shape, n_steps, paths.data)
    payload = encode_episode(arrays)
    atomic_write_bytes(paths.data, payload)
    sidecar = {
        **metadata,
        "format_version": FORMAT_VERSION,
        "episode_id": episode_id,
        "file": paths.data.name,
        "n_steps": n_steps,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "file_size": len(payload),
    }
    atomic_write_json(paths.sidecar, sidecar)
    return sidecar


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


def _observation_header(archive: zipfile.ZipFile, data_path: Path) -> tuple[tuple[int, ...], np.dtype]:
    try:
        with archive.open("observations.npy") as member:
            version = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)  # the header only: no pixels decoded
    except KeyError:
        raise EpisodeFileError(f"{data_path}: array 'observations' is missing") from None
    except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise EpisodeFileError(f"{data_path}: array 'observations' has an unreadable header ({exc})") from None
    return tuple(shape), np.dtype(dtype)


def load_episode_arrays(sidecar_path: Path, include_observations: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and fully validate one episode: sidecar, checksum, dtypes, shapes, finite actions."""
    sidecar_path = Path(sidecar_path)
    sidecar = read_sidecar(sidecar_path)
    data_path = sidecar_path.parent / sidecar["file"]
    n_steps = int(sidecar["n_steps"])
    with _open_archive(data_path, sidecar) as archive:
        arrays = {name: _read_member(archive, name, data_path) for name in SMALL_ARRAYS}
        if include_observations:
            arrays["observations"] = _read_member(archive, "observations", data_path)
            obs_shape, obs_dtype = arrays["observations"].shape, arrays["observations"].dtype
        else:
            obs_shape, obs_dtype = _observation_header(archive, data_path)
    if len(arrays["actions"]) != n_steps:
        raise EpisodeFileError(f"{data_path}: {len(arrays['actions'])} actions but the sidecar says n_steps={n_steps}")
    check_array("observations", obs_dtype, obs_shape, n_steps, data_path)
    for name in SMALL_ARRAYS:
        check_array(name, arrays[name].dtype, arrays[name].shape, n_steps, data_path)
    for name in ("actions", "expert_actions"):
        bad = ~np.isfinite(arrays[name])
        if bad.any():
            step = int(np.argwhere(bad)[0][0])
            raise EpisodeFileError(f"{data_path}: array '{name}' holds NaN/inf (first at step {step})")
    return sidecar, arrays
