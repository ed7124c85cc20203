"""Import a Udacity simulator recording (``IMG/`` + ``driving_log.csv``) as standard episodes.

The log has 7 columns — center, left, right, steering, throttle, brake, speed — with or without
a header row (the sample data has one, self-recorded logs do not). Image paths may be relative
to the recording folder, absolute, Windows-style (backslashes, drive letters) or absolute paths
from the machine that recorded: a path that does not exist as given is looked up as
``IMG/<file name>`` in the recording folder. Surrounding spaces are ignored (the sample data's
left/right columns start with one).

Every image of every row is decoded (cv2, converted to RGB) and must be a 160×320 colour
frame. Missing or unreadable images are ALL listed in one :class:`UdacityImportError` (log line
and camera for each), or, with ``skip_missing``, their rows are left out.

Episodes. A log is one continuous drive; it is cut into episodes of ``episode_length`` steps
(default 200, ~20 s at the simulator's ~10 Hz) so that sequences are built per episode and the
split works on them. Row r's frame and (steering, throttle, brake) are step r's observation and
action; an episode's final observation is the first frame of the next one, so no label is lost
inside a stretch. The last episode of a stretch takes the remainder (N to 2N−1 steps; fewer when
the stretch itself is shorter). A skipped row ends a stretch (no sequence spans the gap); a
stretch of one row has no step and is dropped. Episode k gets track seed ``first_seed + k`` and
id ``udacity_seed<seed>``: recordings have no track seeds, so the seed is the episode's index in
the drive, and the usual seed split (``auto``: first 80 % / next 10 % / last 10 %) holds out the
LAST stretches of the drive as validation and test — contiguous blocks of time, so near-identical
neighbouring frames never fall on both sides except at the two block boundaries. Give disjoint
``first_seed`` ranges to import several recordings into one folder.

The episode format's extension for these episodes is described in :mod:`nsacdrive.data_collection.episode`
(``frame_kind`` ``udacity``, ``left_observations`` / ``right_observations``, NaN pose and
progress, zero-column state). Output is staged in a temporary folder and moved in only when the
whole import succeeded, so a failed import leaves nothing behind.

:func:`udacity_dataset` resolves ``udacity:DIR`` data paths: a raw recording is imported once
into ``DIR/.nsacdrive-import/`` (atomically, by renaming a finished folder; re-imported when
the log changes), an already imported folder is used as it is.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import cv2
import numpy as np

from nsacdrive.common.atomic import PARTIAL_SUFFIX, STALE_SUFFIX, atomic_write_json, remove_abandoned_stages, replace_folder
from nsacdrive.data_collection.episode import CAMERA_ARRAYS, EpisodePaths, write_episode
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.manifest import sidecar_paths, write_manifest
from nsacdrive.data_collection.udacity_layout import LOG_NAME
from nsacdrive.envs.udacity_observation import UDACITY_PREPROCESS_VERSION, UDACITY_RAW_FRAME_SHAPE

SOURCE = "udacity-import"
CAMERAS = tuple(CAMERA_ARRAYS)  # center, left, right: the log's first three columns
LOG_COLUMNS = (*CAMERAS, "steering", "throttle", "brake", "speed")
MAX_STEERING = 1.0  # |steering| of a log row: the steer label's range
DEFAULT_EPISODE_LENGTH = 200
CACHE_NAME = ".nsacdrive-import"
STAMP_NAME = ".import.json"  # hidden: sidecar_paths never mistakes it for an episode
IMPORT_VERSION = 1


class UdacityImportError(DatasetError):
    """A problem with a recording; the message names the file, the log line and what was expected."""


@dataclass(frozen=True)
class ImportConfig:
    """``episode_length``: steps per episode; ``first_seed``: track seed of the first episode;
    ``skip_missing``: leave out rows with a missing or unreadable image instead of failing."""

    episode_length: int = DEFAULT_EPISODE_LENGTH
    first_seed: int = 0
    skip_missing: bool = False

    def __post_init__(self) -> None:
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")
        if self.first_seed < 0:
            raise ValueError(f"first_seed must be >= 0, got {self.first_seed}")


@dataclass(frozen=True)
class LogRow:
    """One parsed log line: image path per camera as written ('' when empty), action and speed."""

    line: int
    images: dict[str, str]
    action: tuple[float, float, float]  # steering, throttle, brake
    speed: float


@dataclass(frozen=True)
class ImageProblem:
    line: int
    camera: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}, {self.camera}: {self.path!r} {self.reason}"


@dataclass
class ImportResult:
    """What an import wrote: the dataset folder, episodes, steps, rows read, rows skipped (with
    every image problem), the cameras stored and whether the log had a header."""

    out: Path
    episodes: int
    steps: int
    rows: int
    header: bool
    cameras: tuple[str, ...]
    skipped_rows: int = 0
    problems: list[ImageProblem] = field(default_factory=list)


def read_driving_log(folder: str | Path) -> tuple[list[LogRow], bool]:
    """Parse ``folder/driving_log.csv``; returns the rows and whether a header row was present."""
    path = Path(folder) / LOG_NAME
    if not path.is_file():
        raise UdacityImportError(f"{path}: driving log not found (a Udacity recording folder holds IMG/ and {LOG_NAME})")
    rows: list[LogRow] = []
    errors: list[str] = []
    header = False
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        for cells in reader:
            cells = [cell.strip() for cell in cells]
            if not any(cells):
                continue
            if len(cells) != len(LOG_COLUMNS):
                errors.append(f"line {reader.line_num}: {len(cells)} columns, expected {len(LOG_COLUMNS)} ({', '.join(LOG_COLUMNS)})")
                continue
            if not rows and not errors and not header and not _is_number(cells[3]):
                if tuple(c.lower() for c in cells) != LOG_COLUMNS:
                    raise UdacityImportError(f"{path}: line {reader.line_num} is neither a data row nor the header "
                                             f"{','.join(LOG_COLUMNS)}: {cells}")
                header = True
                continue
            values = []
            for name, cell in zip(LOG_COLUMNS[3:], cells[3:]):
                if not _is_number(cell):
                    errors.append(f"line {reader.line_num}: {name} {cell!r} is not a finite number")
                values.append(float(cell) if _is_number(cell) else math.nan)
            if abs(values[0]) > MAX_STEERING:  # NaN compares False: reported above as not a number
                errors.append(f"line {reader.line_num}: steering {cells[3]} is outside [-{MAX_STEERING:g}, {MAX_STEERING:g}] "
                              "(the simulator logs the normalised steering angle)")
            rows.append(LogRow(reader.line_num, dict(zip(CAMERAS, cells[:3])), (values[0], values[1], values[2]), values[3]))
    if errors:
        raise UdacityImportError(f"{path}: {len(errors)} malformed line(s):\n  " + "\n  ".join(errors))
    if not rows:
        raise UdacityImportError(f"{path}: no data rows")
    return rows, header


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def image_candidates(folder: str | Path, written: str) -> list[Path]:
    """Where an image path from the log may be, in order: as written (relative paths from the
    recording folder, backslashes read as separators), then ``IMG/<file name>`` in the folder."""
    folder = Path(folder)
    normalised = written.strip().replace("\\", "/")
    given = Path(normalised)
    candidates = [given if given.is_absolute() else folder / given, folder / "IMG" / PurePosixPath(normalised).name]
    return list(dict.fromkeys(candidates))


def read_camera_image(folder: Path, written: str) -> tuple[np.ndarray | None, str]:
    """The decoded uint8 RGB frame of one logged path, or (None, why not)."""
    if not written:
        return None, "is empty (no image path in this column)"
    candidates = image_candidates(folder, written)
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        return None, "not found (looked for " + ", ".join(str(c) for c in candidates) + ")"
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        return None, f"is unreadable ({path} is not an image cv2 can decode)"
    if bgr.shape != UDACITY_RAW_FRAME_SHAPE:
        return None, f"has shape {bgr.shape} ({path}), expected {UDACITY_RAW_FRAME_SHAPE} (160×320 colour)"
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), ""


def log_sha256(folder: str | Path) -> str:
    return hashlib.sha256((Path(folder) / LOG_NAME).read_bytes()).hexdigest()


def _episode_arrays(frames: list[dict[str, np.ndarray]], rows: list[LogRow], cameras: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Episode arrays from T+1 decoded rows (the last one only gives the final observation)."""
    n_steps, n_frames = len(rows) - 1, len(rows)
    actions = np.array([row.action for row in rows[:-1]], dtype=np.float32)
    truncations = np.zeros(n_steps, dtype=bool)
    truncations[-1] = True
    nan_frames = np.full(n_frames, np.nan, dtype=np.float32)
    arrays = {
        "actions": actions,
        "expert_actions": actions.copy(),
        "rewards": np.full(n_steps, np.nan, dtype=np.float32),
        "terminations": np.zeros(n_steps, dtype=bool),
        "truncations": truncations,
        "pose": np.full((n_frames, 3), np.nan, dtype=np.float32),
        "speed": np.array([row.speed for row in rows], dtype=np.float32),
        "lateral_error": nan_frames.copy(),
        "heading_error": nan_frames.copy(),
        "progress": nan_frames.copy(),
        "state": np.zeros((n_frames, 0), dtype=np.float32),
    }
    for camera in cameras:
        arrays[CAMERA_ARRAYS[camera]] = np.stack([frame[camera] for frame in frames])
    return arrays


def _metadata(folder: Path, digest: str, header: bool, seed: int, rows: list[LogRow], cameras: tuple[str, ...],
              reason: str) -> dict[str, Any]:
    return {
        "frame_kind": "udacity",
        "renderer": "udacity-simulator",
        "track_seed": seed,
        "colour_preset": "default",  # the simulator's own colours, never recoloured
        "colour_scheme": None,
        "source": SOURCE,
        "agent": {"agent_id": "udacity-recording"},
        "agent_spec": SOURCE,
        "noise": None,
        "total_reward": None,
        "lap_finished": None,
        "termination_reason": reason,
        "cameras": list(cameras),
        "recording": {"folder": str(folder.resolve()), "log_sha256": digest, "header": header,
                      "lines": [rows[0].line, rows[-1].line]},
        "preprocess": UDACITY_PREPROCESS_VERSION,
        "importer_version": IMPORT_VERSION,
    }


class _EpisodeWriter:
    """Cuts stretches of consecutive usable rows into episodes and writes them (see the module
    docstring): holds at most 2N+1 decoded rows, writing an N-step episode whenever 2N steps are
    buffered, so the last episode of a stretch gets the remaining N to 2N−1 steps."""

    def __init__(self, stage: Path, folder: Path, header: bool, cameras: tuple[str, ...], config: ImportConfig) -> None:
        self.stage, self.folder, self.header, self.cameras, self.config = stage, folder, header, cameras, config
        self.digest = log_sha256(folder)
        self.buffer: list[tuple[LogRow, dict[str, np.ndarray]]] = []
        self.seed, self.steps = config.first_seed, 0

    def add(self, row: LogRow, images: dict[str, np.ndarray]) -> None:
        self.buffer.append((row, images))
        n = self.config.episode_length
        if len(self.buffer) == 2 * n + 1:
            self._write(self.buffer[: n + 1], "chunk")
            self.buffer = self.buffer[n:]

    def end_stretch(self, reason: str) -> None:
        """The stretch ends here (``reason``: end_of_log or skipped_rows); one row alone has no step."""
        if len(self.buffer) > 1:
            self._write(self.buffer, reason)
        self.buffer = []

    def _write(self, buffered: list[tuple[LogRow, dict[str, np.ndarray]]], reason: str) -> None:
        rows = [row for row, _ in buffered]
        arrays = _episode_arrays([images for _, images in buffered], rows, self.cameras)
        write_episode(self.stage, f"udacity_seed{self.seed:06d}", arrays,
                      _metadata(self.folder, self.digest, self.header, self.seed, rows, self.cameras, reason))
        self.seed, self.steps = self.seed + 1, self.steps + len(rows) - 1

    @property
    def episodes(self) -> int:
        return self.seed - self.config.first_seed


def import_recording(folder: str | Path, out: str | Path, config: ImportConfig = ImportConfig(),
                     progress: bool = False) -> ImportResult:
    """Import the recording in ``folder`` into the dataset folder ``out`` (created if needed).

    Fails with :class:`UdacityImportError` (and writes nothing) on a malformed log, on missing
    or unreadable images unless ``config.skip_missing``, and when ``out`` already holds an
    episode id this import would write. Every image is decoded once.
    """
    from nsacdrive.common.progress import progress_bar

    folder, out = Path(folder), Path(out)
    rows, header = read_driving_log(folder)
    cameras = tuple(c for c in CAMERAS if any(row.images[c] for row in rows))
    problems: list[ImageProblem] = []
    bad_rows = 0
    remove_abandoned_stages(out.parent, f".{out.name}")  # an import into ``out`` that was killed
    stage = out.parent / f".{out.name}.{os.getpid()}{PARTIAL_SUFFIX}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        writer = _EpisodeWriter(stage, folder, header, cameras, config)
        for row in progress_bar(rows, desc="importing", unit="row", disable=not progress):
            images, row_problems = {}, []
            for camera in cameras:
                image, reason = read_camera_image(folder, row.images[camera])
                if image is None:
                    row_problems.append(ImageProblem(row.line, camera, row.images[camera], reason))
                images[camera] = image
            if row_problems:
                problems += row_problems
                bad_rows += 1
                writer.end_stretch("skipped_rows")
            elif config.skip_missing or not problems:  # after a problem without skipping: only list the rest
                writer.add(row, images)
        if problems and not config.skip_missing:
            raise UdacityImportError(f"{folder / LOG_NAME}: {len(problems)} image(s) missing or unreadable "
                                     "(pass --skip-missing to import without their rows):\n  " + "\n  ".join(map(str, problems)))
        writer.end_stretch("end_of_log")
        if writer.episodes == 0:
            raise UdacityImportError(f"{folder / LOG_NAME}: no episode to write (no two consecutive usable rows)")
        write_manifest(stage)
        _move_into(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return ImportResult(out, writer.episodes, writer.steps, len(rows), header, cameras, bad_rows, problems)


def _move_into(stage: Path, out: Path) -> None:
    """Move a finished staging folder's episodes into ``out``: by renaming the folder when ``out``
    does not exist, else file by file (each episode's sidecar last), then rewrite the manifest."""
    if not out.exists():
        try:
            os.rename(stage, out)
            return
        except OSError:
            if not out.is_dir():
                raise
    ids = [path.stem for path in sidecar_paths(stage)]
    clashes = [i for i in ids if EpisodePaths.for_id(out, i).sidecar.exists() or EpisodePaths.for_id(out, i).data.exists()]
    if clashes:
        raise UdacityImportError(f"{out}: already holds episodes {clashes[:5]}{' …' if len(clashes) > 5 else ''}; "
                                 "import into another --out or give a --seed past its track seeds")
    for episode_id in ids:
        source, target = EpisodePaths.for_id(stage, episode_id), EpisodePaths.for_id(out, episode_id)
        os.replace(source.data, target.data)
        os.replace(source.sidecar, target.sidecar)
    write_manifest(out)


def udacity_dataset(folder: str | Path) -> Path:
    """The dataset folder for ``udacity:DIR``: DIR itself when it is an imported dataset, else
    (DIR holds ``driving_log.csv``) its import cache ``DIR/.nsacdrive-import``, (re)built when
    missing or made from another log, importer version or episode length."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UdacityImportError(f"udacity:{folder}: folder does not exist (expected a Udacity recording or an imported dataset)")
    if not (folder / LOG_NAME).is_file():
        return folder
    cache = folder / CACHE_NAME
    stamp = {"log_sha256": log_sha256(folder), "importer_version": IMPORT_VERSION, "episode_length": DEFAULT_EPISODE_LENGTH}
    if _read_stamp(cache) == stamp:
        return cache
    remove_abandoned_stages(folder, CACHE_NAME)  # caches a killed process was building or replacing
    remove_abandoned_stages(folder, CACHE_NAME, STALE_SUFFIX)
    building = folder / f"{CACHE_NAME}.{os.getpid()}{PARTIAL_SUFFIX}"
    try:
        shutil.rmtree(building, ignore_errors=True)
        import_recording(folder, building, ImportConfig(episode_length=DEFAULT_EPISODE_LENGTH), progress=True)
        atomic_write_json(building / STAMP_NAME, stamp)
        # another process may have finished the same import first: its cache will do
        replace_folder(building, cache, accept_existing=lambda rival: _read_stamp(rival) == stamp)
    except PermissionError as exc:
        raise UdacityImportError(f"udacity:{folder}: cannot write the import cache {cache} ({exc}); import it elsewhere "
                                 f"with `nsacdrive udacity import {folder} --out DATA` and use udacity:DATA") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return cache


def _read_stamp(cache: Path) -> dict[str, Any] | None:
    try:
        return json.loads((cache / STAMP_NAME).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
