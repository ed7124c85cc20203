"""Read a closed-loop evaluation folder (``nsacdrive eval --out DIR``) back for figures and videos.

The folder holds ``aggregates.json`` (per (model, preset) rows and the evaluation settings) and
``episodes/<id>.json`` + ``episodes/<id>.npz`` per episode (see :mod:`nsacdrive.eval.closed_loop`). Every
problem is an :class:`EvaluationError` that names the file, so the command line can report it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nsacdrive.eval.closed_loop import LOG_FIELDS, OPTIONAL_LOG_FIELDS, DriveConfig


class EvaluationError(ValueError):
    """An evaluation folder or one of its episodes is missing, unreadable or unusable."""


def load_aggregates(eval_dir: Path) -> dict[str, Any]:
    """``aggregates.json`` of an evaluation folder (rows under ``aggregates``, plus the settings)."""
    return _read_json(Path(eval_dir) / "aggregates.json", "not found; expected an evaluation folder written by `nsacdrive eval`")


def drive_config(eval_dir: Path, samples: int | None = None) -> DriveConfig:
    """How the evaluation drove its episodes (from its ``aggregates.json``; settings it does not
    record take their defaults); ``samples`` replaces its draws per prediction."""
    settings = load_aggregates(eval_dir)
    recorded = {f.name: settings[f.name] for f in dataclasses.fields(DriveConfig) if f.name in settings}
    try:
        drive = DriveConfig(**recorded)
    except (TypeError, ValueError) as exc:
        raise EvaluationError(f"{Path(eval_dir) / 'aggregates.json'}: unusable drive settings ({exc})") from None
    if drive.device != "cpu" and not _device_present(drive.device):  # a GPU evaluation re-driven here: the same
        drive = dataclasses.replace(drive, device="cpu")               # episodes up to float rounding (DriveConfig.device)
    return drive if samples is None else dataclasses.replace(drive, samples=samples)


def describe_action_settings(settings: dict[str, Any]) -> str:
    """How an evaluation post-processed the predicted actions, in words (for figure titles and reports)."""
    cap, caution, gas = settings.get("throttle_cap"), settings.get("pedal_caution"), settings.get("gas_caution")
    parts = ["no throttle cap" if cap is None else f"throttle cap {cap}"]
    if caution is not None:
        parts.append(f"pedal caution {caution}" + ("" if gas is None else f" (gas {gas})"))
    return ", ".join(parts)


def _device_present(device: str) -> bool:
    kind = torch.device(device)
    return kind.type != "cuda" or (torch.cuda.is_available() and (kind.index or 0) < torch.cuda.device_count())


def load_records(eval_dir: Path) -> list[dict[str, Any]]:
    """Every episode record (``episodes/*.json``), sorted by episode id."""
    folder = Path(eval_dir) / "episodes"
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise EvaluationError(f"{folder}: no episode records found")
    return [_read_json(path) for path in paths]


def load_episode(eval_dir: Path, episode_id: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The record and per-step arrays of one finished (not failed) episode."""
    record = _read_json(Path(eval_dir) / "episodes" / f"{episode_id}.json")
    return record, load_log(eval_dir, record)


def load_log(eval_dir: Path, record: dict[str, Any]) -> dict[str, np.ndarray]:
    """The per-step arrays of the finished (not failed) episode whose record (:func:`load_records`) is ``record``."""
    episode_id = record["episode_id"]
    if record["failed"]:
        raise EvaluationError(f"{episode_id}: the episode failed ({record['reason']}); it has no per-step log")
    path = Path(eval_dir) / "episodes" / f"{episode_id}.npz"
    try:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise EvaluationError(f"{path}: cannot read the per-step log ({exc})") from None
    for name, value in OPTIONAL_LOG_FIELDS.items():  # fields that older logs lack
        if name not in arrays and "speed" in arrays:
            arrays[name] = np.full(len(arrays["speed"]), value, dtype=np.float32)
    missing = [name for name in LOG_FIELDS if name not in arrays]
    if missing:
        raise EvaluationError(f"{path}: the per-step log lacks {', '.join(missing)}; re-run `nsacdrive eval` with this version")
    return arrays


def _read_json(path: Path, missing: str = "episode record not found") -> dict[str, Any]:
    """The JSON object in ``path``; :class:`EvaluationError` saying ``missing`` or why it is unreadable."""
    if not path.is_file():
        raise EvaluationError(f"{path}: {missing}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"{path}: not valid JSON ({exc})") from None


def condition_label(record: dict[str, Any]) -> str:
    """The conditions an episode or aggregate row was driven under: its colour preset, plus its
    corruption when it has one (``default+fog-3``; records from before corruptions have none)."""
    corruption = record.get("corruption", "none")
    return record["colour_preset"] if corruption == "none" else f"{record['colour_preset']}+{corruption}"


def clean_conditions(record: dict[str, Any]) -> bool:
    """Whether an episode was driven under default colours with no corruption (a nominal lap)."""
    return condition_label(record) == "default"


def group_label(record: dict[str, Any]) -> str:
    """How a controller is named in figures: its model and run folder (two runs may share a model).

    Works on episode records (``run`` is a path) and on aggregate rows (``run`` is its name).
    """
    return f"{record['model']} ({Path(record['run']).name})"


def choose_episodes(records: list[dict[str, Any]], limit: int = 6) -> list[str]:
    """A mix of finished episodes to look at: per controller the best and worst by score, then the
    next best and next worst, taken round-robin over controllers until ``limit``.

    Best and worst show both what a controller can do and how it fails; round-robin keeps every
    controller represented when the limit is small.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if not r["failed"]:
            groups.setdefault(group_label(r), []).append(r)
    queues = []
    for _, items in sorted(groups.items()):
        ranked = sorted(items, key=lambda r: (-r["score"], r["episode_id"]))
        ends = [ranked[i // 2] if i % 2 == 0 else ranked[-1 - i // 2] for i in range(len(ranked))]
        queues.append([r["episode_id"] for r in ends])
    chosen: list[str] = []
    for rank in range(max((len(q) for q in queues), default=0)):
        chosen += [q[rank] for q in queues if rank < len(q)]
    return chosen[:limit]
