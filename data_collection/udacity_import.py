"""Import a Udacity simulator recording (``IMG/`` + ``driving_log.csv``) as standard episodes.

The log has 7 columns — center, left, right, steering, throttle, brake, speed — with or without
a header row (the sample data has one, self-recorded logs do not). Image paths may be relative
to the recording folder, absolute, Windows-style (backslashes, drive letters) or absolute paths
from the machine that recorded: a path that does not exist as given is looked up as
``IMG/<file name>`` in the recording folder. Surrounding spaces are ignored (the sample data's
left/right columns start with one).

Bounds. The log is streamed, one line at a time: read once to check it (keeping counts only) and
once more to import it. A line longer than :data:`MAX_LINE_BYTES` bytes, a field longer than
:data:`MAX_FIELD_CHARS` characters or a line that is not UTF-8 is a malformed line. An image path
must stay inside the recording folder once ``..`` and symlinks are resolved; a path outside it is
never looked at — so the error is the same whether or not an outside file exists — unless
``allow_outside``. A foreign absolute path still maps to ``IMG/<file name>``, which is inside. An
image file may have at most :data:`~nsacdrive.data_collection.udacity_layout.MAX_FRAME_BYTES`
bytes, and its JPEG/PNG header must declare 320×160 pixels before it is decoded.

Every image of every row is decoded (cv2, converted to RGB) and must be a 160×320 colour
frame. Malformed lines, and missing or unreadable images, are counted in one
:class:`UdacityImportError` that lists the first :data:`MAX_LISTED` (log line, and camera for an
image); with ``skip_missing``, rows with an image problem are left out instead.

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

import codecs
import csv
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

import cv2
import numpy as np

from nsacdrive.common.atomic import PARTIAL_SUFFIX, STALE_SUFFIX, atomic_write_json, remove_abandoned_stages, replace_folder
from nsacdrive.common.config_checks import NON_NEGATIVE, Range
from nsacdrive.data_collection.episode import CAMERA_ARRAYS, EpisodePaths, write_episode
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.manifest import sidecar_paths, write_manifest
from nsacdrive.data_collection.udacity_layout import FRAME_SIZE, IMG_DIR, LOG_NAME, MAX_FRAME_BYTES, declared_frame_size
from nsacdrive.envs.udacity_observation import UDACITY_PREPROCESS_VERSION, UDACITY_RAW_FRAME_SHAPE

SOURCE = "udacity-import"
CAMERAS = tuple(CAMERA_ARRAYS)  # center, left, right: the log's first three columns
LOG_COLUMNS = (*CAMERAS, "steering", "throttle", "brake", "speed")
MAX_STEERING = 1.0  # |steering| of a log row: the steer label's range
DEFAULT_EPISODE_LENGTH = 200
CACHE_NAME = ".nsacdrive-import"
STAMP_NAME = ".import.json"  # hidden: sidecar_paths never mistakes it for an episode
IMPORT_VERSION = 1
MAX_FIELD_CHARS = 4096  # a field of the log (an image path is at most PATH_MAX long)
MAX_LINE_BYTES = len(LOG_COLUMNS) * (MAX_FIELD_CHARS + 3)  # seven quoted fields and their commas
MAX_LISTED = 20  # problems an error or a skip report lists in full; the rest are counted
IMAGE_PROBLEMS = "missing or unreadable images"  # what an import's image problems are counted as


class UdacityImportError(DatasetError):
    """A problem with a recording; the message names the file, the log line and what was expected."""


#: the longest imported episode: CarRacing's horizon; its three cameras' frames take about half a GB while it is written
MAX_EPISODE_LENGTH = 1000
#: the numbers ImportConfig's numeric fields may take (an episode's decoded frames are held while it is written)
IMPORT_RANGES = {"episode_length": Range(1, MAX_EPISODE_LENGTH), "first_seed": NON_NEGATIVE}
#: what each of those fields is called in messages: the ``nsacdrive udacity import`` option that sets it
_IMPORT_OPTIONS = {"episode_length": "--episode-length", "first_seed": "--seed"}


@dataclass(frozen=True)
class ImportConfig:
    """``episode_length``: steps per episode; ``first_seed``: track seed of the first episode;
    ``skip_missing``: leave out rows with a missing or unreadable image instead of failing;
    ``allow_outside``: also read image paths that lead outside the recording folder."""

    episode_length: int = DEFAULT_EPISODE_LENGTH
    first_seed: int = 0
    skip_missing: bool = False
    allow_outside: bool = False

    def __post_init__(self) -> None:
        for name, bounds in IMPORT_RANGES.items():
            value = getattr(self, name)
            if not bounds.contains(value):
                raise ValueError(f"{_IMPORT_OPTIONS[name]} must be {bounds}, got {value!r}")


@dataclass(frozen=True)
class LogRow:
    """One parsed log line: image path per camera as written ('' when empty), action and speed."""

    line: int
    images: dict[str, str]
    action: tuple[float, float, float]  # steering, throttle, brake
    speed: float


@dataclass(frozen=True)
class BadLine:
    """A malformed log line and what is wrong with it."""

    line: int
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}"


@dataclass(frozen=True)
class ImageProblem:
    line: int
    camera: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}, {self.camera}: {self.path!r} {self.reason}"


@dataclass
class ProblemList:
    """The first :data:`MAX_LISTED` problems and a count of all: a log of a million bad lines
    costs neither memory nor a million lines of output. ``noun`` names what is counted."""

    noun: str
    listed: list[Any] = field(default_factory=list)
    total: int = 0

    def add(self, problem: Any) -> None:
        self.total += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(problem)

    def __len__(self) -> int:
        return self.total

    def lines(self) -> list[str]:
        """One line per listed problem, then "… and N more <noun>" when some were not listed."""
        more = self.total - len(self.listed)
        return [str(problem) for problem in self.listed] + ([f"… and {more} more {self.noun}"] if more else [])

    def report(self, head: str) -> str:
        return head + ":\n  " + "\n  ".join(self.lines())


@dataclass
class ImportResult:
    """What an import wrote: the dataset folder, episodes, steps, rows read, rows skipped (with
    their image problems), the cameras stored and whether the log had a header."""

    out: Path
    episodes: int
    steps: int
    rows: int
    header: bool
    cameras: tuple[str, ...]
    skipped_rows: int = 0
    problems: ProblemList = field(default_factory=lambda: ProblemList(IMAGE_PROBLEMS))


@dataclass(frozen=True)
class DrivingLog:
    """A checked ``driving_log.csv``: whether it starts with a header, how many data rows it has
    and which cameras have a path in some row. Iterating parses its rows again, one at a time,
    so that nothing holds every row of a long log."""

    path: Path
    header: bool
    rows: int
    cameras: tuple[str, ...]

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[LogRow]:
        for item in _log_items(self.path, self.header):
            if isinstance(item, BadLine):
                raise UdacityImportError(f"{self.path}: {item} (the log changed during the import; import again)")
            yield item


def read_driving_log(folder: str | Path) -> tuple[DrivingLog, bool]:
    """Check ``folder/driving_log.csv`` in one streamed pass; returns the log (its rows are read
    on iteration) and whether a header row was present."""
    path = Path(folder) / LOG_NAME
    if not path.is_file():
        raise UdacityImportError(f"{path}: driving log not found (a Udacity recording folder holds IMG/ and {LOG_NAME})")
    header = _starts_with_header(path)
    bad, rows, cameras = ProblemList("malformed lines"), 0, set()
    for item in _log_items(path, header):
        if isinstance(item, BadLine):
            bad.add(item)
        else:
            rows += 1
            cameras.update(camera for camera in CAMERAS if item.images[camera])
    if bad:
        raise UdacityImportError(bad.report(f"{path}: {len(bad)} malformed line(s)"))
    if not rows:
        raise UdacityImportError(f"{path}: no data rows")
    return DrivingLog(path, header, rows, tuple(c for c in CAMERAS if c in cameras)), header


def _physical_lines(path: Path) -> Iterator[tuple[int, str] | BadLine]:
    """(line number, text) of each line of ``path``, read in bounded pieces; a line longer than
    :data:`MAX_LINE_BYTES` (skipped without being held whole) or not UTF-8 is a :class:`BadLine`."""
    with open(path, "rb") as handle:
        number = 0
        while chunk := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(chunk) > MAX_LINE_BYTES:
                while chunk and not chunk.endswith(b"\n"):
                    chunk = handle.readline(MAX_LINE_BYTES)
                yield BadLine(number, f"longer than {MAX_LINE_BYTES} bytes (expected {len(LOG_COLUMNS)} short fields)")
                continue
            try:
                yield number, (chunk.removeprefix(codecs.BOM_UTF8) if number == 1 else chunk).decode("utf-8")
            except UnicodeDecodeError as exc:
                yield BadLine(number, f"not UTF-8 text (byte {exc.start + 1})")


def _cell_lines(path: Path) -> Iterator[tuple[int, list[str]] | BadLine]:
    """(line number, stripped cells) of each non-blank line, or a :class:`BadLine` for a line that
    is too long, not text or has a field longer than :data:`MAX_FIELD_CHARS`."""
    for item in _physical_lines(path):
        if isinstance(item, BadLine):
            yield item
            continue
        number, text = item
        try:
            cells = [cell.strip() for cell in next(csv.reader([text]), [])]
        except csv.Error as exc:
            yield BadLine(number, f"not a CSV line ({exc})")
            continue
        longest = max(range(len(cells)), key=lambda i: len(cells[i]), default=None)
        if longest is not None and len(cells[longest]) > MAX_FIELD_CHARS:
            yield BadLine(number, f"field {longest + 1} has {len(cells[longest])} characters, expected at most {MAX_FIELD_CHARS}")
        elif any(cells):
            yield number, cells


def _starts_with_header(path: Path) -> bool:
    """Whether the first non-blank line is the header; a first line that is neither a data row nor
    the header is an error (a log of another format)."""
    first = next(_cell_lines(path), None)
    if first is None or isinstance(first, BadLine):
        return False
    number, cells = first
    if len(cells) != len(LOG_COLUMNS) or _is_number(cells[3]):
        return False
    if tuple(cell.lower() for cell in cells) != LOG_COLUMNS:
        shown = [cell[:40] for cell in cells]
        raise UdacityImportError(f"{path}: line {number} is neither a data row nor the header {','.join(LOG_COLUMNS)}: {shown}")
    return True


def _log_items(path: Path, header: bool) -> Iterator[LogRow | BadLine]:
    """Each data row of the log (the header skipped when ``header``), or the line's problems."""
    lines = _cell_lines(path)
    if header:
        next(lines)
    for item in lines:
        yield item if isinstance(item, BadLine) else _log_row(*item)


def _log_row(number: int, cells: list[str]) -> LogRow | BadLine:
    """One data row from its cells, or every problem of the line in one :class:`BadLine`."""
    if len(cells) != len(LOG_COLUMNS):
        return BadLine(number, f"{len(cells)} columns, expected {len(LOG_COLUMNS)} ({', '.join(LOG_COLUMNS)})")
    problems = [f"{name} {cell[:40]!r} is not a finite number" for name, cell in zip(LOG_COLUMNS[3:], cells[3:])
                if not _is_number(cell)]
    if not problems and abs(float(cells[3])) > MAX_STEERING:
        problems.append(f"steering {cells[3]} is outside [-{MAX_STEERING:g}, {MAX_STEERING:g}] "
                        "(the simulator logs the normalised steering angle)")
    if problems:
        return BadLine(number, "; ".join(problems))
    steering, throttle, brake, speed = (float(cell) for cell in cells[3:])
    return LogRow(number, dict(zip(CAMERAS, cells[:3])), (steering, throttle, brake), speed)


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
    candidates = [given if given.is_absolute() else folder / given, folder / IMG_DIR / PurePosixPath(normalised).name]
    return list(dict.fromkeys(candidates))


@dataclass(frozen=True)
class ImageFolder:
    """Reads a recording's camera images: only from inside ``folder`` (after ``..`` and symlinks)
    unless ``allow_outside``."""

    folder: Path
    allow_outside: bool = False
    #: image folder → its symlink-resolved path, for this reader's import only (a recording's images
    #: share a few folders; a later import re-resolves, so a re-pointed symlink is seen)
    _resolved: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def roots(self) -> tuple[str, ...]:
        """The folder as given (made absolute and normalised) and with its symlinks resolved."""
        return tuple(dict.fromkeys((os.path.abspath(self.folder), os.path.realpath(self.folder))))

    def inside(self, path: Path) -> bool:
        """Whether ``path`` stays in the folder: decided on the path's text first, so a path that
        leads outside is never looked up on disk, then with its symlinks resolved (its folder's
        resolution cached: a recording's images share a few folders). Plain strings: this runs
        for every image of a log."""
        lexical = os.path.abspath(path)
        if not any(_within(lexical, root) for root in self.roots):
            return False
        try:
            if os.path.islink(lexical):
                resolved = os.path.realpath(lexical)
            else:
                folder = os.path.dirname(lexical)
                if folder not in self._resolved:
                    self._resolved[folder] = os.path.realpath(folder)
                resolved = os.path.join(self._resolved[folder], os.path.basename(lexical))
        except (OSError, ValueError):  # a name too long, a NUL byte: not a usable image path
            return False
        return _within(resolved, self.roots[-1])

    def find(self, written: str) -> tuple[Path | None, str]:
        """The file a logged path names, or (None, why not)."""
        candidates = image_candidates(self.folder, written)
        allowed = candidates if self.allow_outside else [c for c in candidates if self.inside(c)]
        path = next((c for c in allowed if _is_file(c)), None)
        if path is not None:
            return path, ""
        if len(allowed) < len(candidates):
            mapped = f" and {IMG_DIR}/{candidates[-1].name} is not in it" if allowed else ""
            return None, f"is outside the recording folder {self.roots[-1]}{mapped} (pass --allow-outside to read it)"
        return None, "not found (looked for " + ", ".join(str(c) for c in candidates) + ")"

    def read(self, written: str) -> tuple[np.ndarray | None, str]:
        """The decoded uint8 RGB frame of one logged path, or (None, why not)."""
        if not written:
            return None, "is empty (no image path in this column)"
        path, reason = self.find(written)
        return (None, reason) if path is None else _decode_frame_file(path)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system, say
        return False


def _decode_frame_file(path: Path) -> tuple[np.ndarray | None, str]:
    """A frame file's uint8 RGB picture, or (None, why not): its size and declared pixels are
    checked before anything is decoded."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FRAME_BYTES + 1)
    except OSError as exc:
        return None, f"is unreadable ({path}: {exc.strerror or exc})"
    if len(data) > MAX_FRAME_BYTES:
        return None, f"is too large ({path} has over {MAX_FRAME_BYTES} bytes; a 320×160 frame has far fewer)"
    size = declared_frame_size(data)
    if size is None:
        return None, f"is unreadable ({path} is not a JPEG or PNG that declares its size)"
    if size != FRAME_SIZE:
        return None, f"is {size[0]}×{size[1]} pixels ({path}), expected {FRAME_SIZE[0]}×{FRAME_SIZE[1]}"
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        return None, f"is unreadable ({path} is not an image cv2 can decode)"
    if bgr.shape != UDACITY_RAW_FRAME_SHAPE:  # an EXIF rotation, say
        return None, f"has shape {bgr.shape} ({path}), expected {UDACITY_RAW_FRAME_SHAPE} (160×320 colour)"
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), ""


def log_sha256(folder: str | Path) -> str:
    with open(Path(folder) / LOG_NAME, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


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

    Fails with :class:`UdacityImportError` (and writes nothing) on a malformed log, on missing,
    unreadable or outside images unless ``config.skip_missing``, and when ``out`` already holds
    an episode id this import would write. The log is streamed and every image decoded once.
    """
    from nsacdrive.common.progress import progress_bar

    folder, out = Path(folder), Path(out)
    log = read_driving_log(folder)[0]
    images = ImageFolder(folder, config.allow_outside)
    problems = ProblemList(IMAGE_PROBLEMS)
    bad_rows = 0
    remove_abandoned_stages(out.parent, f".{out.name}")  # an import into ``out`` that was killed
    stage = out.parent / f".{out.name}.{os.getpid()}{PARTIAL_SUFFIX}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        writer = _EpisodeWriter(stage, folder, log.header, log.cameras, config)
        for row in progress_bar(log, total=len(log), desc="importing", unit="row", disable=not progress):
            frames, row_problems = {}, []
            for camera in log.cameras:
                frames[camera], reason = images.read(row.images[camera])
                if frames[camera] is None:
                    row_problems.append(ImageProblem(row.line, camera, row.images[camera], reason))
            if row_problems:
                for problem in row_problems:
                    problems.add(problem)
                bad_rows += 1
                writer.end_stretch("skipped_rows")
            elif config.skip_missing or not problems:  # after a problem without skipping: only list the rest
                writer.add(row, frames)
        if problems and not config.skip_missing:
            raise UdacityImportError(problems.report(f"{log.path}: {len(problems)} image(s) missing or unreadable "
                                                     "(pass --skip-missing to import without their rows)"))
        writer.end_stretch("end_of_log")
        if writer.episodes == 0:
            raise UdacityImportError(f"{log.path}: no episode to write (no two consecutive usable rows)")
        write_manifest(stage)
        _move_into(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return ImportResult(out, writer.episodes, writer.steps, len(log), log.header, log.cameras, bad_rows, problems)


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
