"""Videos of closed-loop episodes: what the controller saw, what it did, how unsure it was.

An episode is re-driven (:func:`nsacdrive.eval.closed_loop.run_episodes` is deterministic: same group, same
settings → same actions) and every 96×96 frame the controller saw is upscaled and written with
a panel underneath: step, speed and signed lateral error as text, bars for the executed steer,
gas and brake, the expert's steer as a yellow marker on the steer bar, and a bar for the
predictive steering std. Before anything is written the re-driven executed actions are compared
with the logged ones, so a video always shows the logged episode (:class:`DeterminismError`
otherwise). The mp4 (``mp4v``) is read back and its frame count and size checked before it is
renamed into place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from nsacdrive.common.atomic import atomic_path
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH
from nsacdrive.eval.closed_loop import EpisodeKey, run_episodes
from nsacdrive.eval.results import EvaluationError, drive_config, load_episode

FRAME_PIXELS = 96
ACTION_TOLERANCE = 1e-5  # re-driven vs logged executed action (float32 logs of the same computation)
ROW_HEIGHT = 7  # panel row height, in frame pixels (× scale on screen)
PANEL_ROWS = 6  # two text rows, steer, gas, brake, steering std
LABEL_WIDTH = 30  # frame pixels before the bars start
FONT = cv2.FONT_HERSHEY_SIMPLEX
BACKGROUND, TEXT, BAR, EXPERT, OFF_ROAD = (40, 40, 40), (235, 235, 235), (80, 180, 80), (0, 215, 255), (60, 60, 230)


class DeterminismError(EvaluationError):
    """Re-driving an episode did not reproduce its logged actions."""


def video_size(scale: int) -> tuple[int, int]:
    """(width, height) of the video frames for a given upscaling factor."""
    side = FRAME_PIXELS * scale
    return side, side + PANEL_ROWS * ROW_HEIGHT * scale


def write_episode_video(eval_dir: Path, episode_id: str, out_path: Path, fps: int = 50, scale: int = 4,
                        samples: int | None = None) -> Path:
    """Re-drive one logged episode and write its annotated video to ``out_path``.

    ``max_steps``, the throttle cap and the draws per prediction come from the evaluation's
    ``aggregates.json``; ``samples`` overrides the latter (folders written before it was recorded).
    """
    arrays, frames = redrive_episode(eval_dir, episode_id, samples)
    images = [annotate(frame, arrays, step, scale) for step, frame in enumerate(frames)]
    write_mp4(images, Path(out_path), fps)
    return Path(out_path)


def redrive_episode(eval_dir: Path, episode_id: str, samples: int | None = None, run: str | Path | None = None,
                    on_agent: Callable[[Any, int], None] | None = None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Re-drive one logged episode with the evaluation's settings: its per-step arrays and every raw
    frame the controller saw, after checking that the executed actions match the log.

    The episode is re-driven inside its lockstep group (``batch_group`` in its record;
    :func:`nsacdrive.eval.closed_loop.run_episodes`), so every row sees the batch it was evaluated in.
    ``run`` replaces the run folder recorded in the episode (an evaluation read from another
    working directory); ``on_agent(policy, row)`` receives the controller before the first step
    and this episode's row in the group's batch (e.g. to hook the network's internals).
    """
    record, logged = load_episode(Path(eval_dir), episode_id)
    run_dir = str(run if run is not None else record["run"])
    corruption = record.get("corruption", "none")
    group = record.get("batch_group", [[record["colour_preset"], record["track_seed"], record["repeat"], corruption]])
    # [preset, seed, repeat(, corruption)]: groups recorded before corruptions have three entries
    keys = [EpisodeKey(run_dir, entry[0], int(entry[1]), int(entry[2]), *entry[3:]) for entry in group]
    row = keys.index(EpisodeKey(run_dir, record["colour_preset"], int(record["track_seed"]), int(record["repeat"]), corruption))
    frames: list[np.ndarray] = []
    results = run_episodes(keys, drive_config(Path(eval_dir), samples),
                           on_frame=lambda i, frame: frames.append(np.array(frame)) if i == row else None,
                           on_policy=None if on_agent is None else (lambda policy: on_agent(policy, row)))
    redriven, arrays = results[row]
    if redriven.failed:
        raise EvaluationError(f"{episode_id}: re-driving the episode failed ({redriven.reason})")
    check_same_actions(episode_id, logged["executed_action"], arrays["executed_action"])
    return arrays, frames


def check_same_actions(episode_id: str, logged: np.ndarray, redriven: np.ndarray) -> None:
    """Raise :class:`DeterminismError` naming the episode unless the executed actions agree."""
    hint = "same run folder, --samples, max steps and throttle cap as the evaluation?"
    if logged.shape != redriven.shape:
        raise DeterminismError(f"{episode_id}: re-driving gave {len(redriven)} steps, the log has {len(logged)} ({hint})")
    difference = np.abs(logged.astype(np.float64) - redriven)
    differ = np.flatnonzero(np.any(difference > ACTION_TOLERANCE, axis=1))
    if len(differ):
        raise DeterminismError(f"{episode_id}: the re-driven executed actions differ from the logged ones from step "
                               f"{differ[0]} on (max |difference| {difference.max():.3g}; {hint})")


def annotate(frame: np.ndarray, arrays: dict[str, np.ndarray], step: int, scale: int) -> np.ndarray:
    """One BGR video frame: the upscaled observation over a panel of text and action bars."""
    width, height = video_size(scale)
    image = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    image[:width] = cv2.resize(np.ascontiguousarray(frame[..., ::-1]), (width, width), interpolation=cv2.INTER_NEAREST)
    lateral = float(arrays["lateral_error"][step])
    executed = arrays["executed_action"][step]
    steer_std = float(np.sqrt(arrays["aleatoric"][step, 0] + arrays["epistemic"][step, 0]))
    off_road = abs(lateral) > TRACK_HALF_WIDTH
    rows = iter(range(PANEL_ROWS))
    _text(image, next(rows), scale, f"step {step + 1}/{len(arrays['executed_action'])}   speed {arrays['speed'][step]:5.1f}")
    _text(image, next(rows), scale, f"lateral {lateral:+5.2f}{'  OFF ROAD' if off_road else ''}   yellow: expert",
          OFF_ROAD if off_road else TEXT)
    _bar(image, next(rows), scale, f"steer {executed[0]:+.2f}", executed[0], -1.0, 1.0,
         marker=float(arrays["expert_action"][step, 0]))
    _bar(image, next(rows), scale, f"gas   {executed[1]:.2f}", executed[1], 0.0, 1.0)
    _bar(image, next(rows), scale, f"brake {executed[2]:.2f}", executed[2], 0.0, 1.0)
    _bar(image, next(rows), scale, f"std   {steer_std:.2f}", steer_std, 0.0, 1.0)
    return image


def _row_top(row: int, scale: int) -> int:
    return FRAME_PIXELS * scale + row * ROW_HEIGHT * scale


def _text(image: np.ndarray, row: int, scale: int, text: str, colour: tuple[int, int, int] = TEXT) -> None:
    baseline = _row_top(row, scale) + ROW_HEIGHT * scale - 2 * scale
    cv2.putText(image, text, (2 * scale, baseline), FONT, 0.11 * scale, colour, max(1, scale // 4), cv2.LINE_AA)


def _bar(image: np.ndarray, row: int, scale: int, label: str, value: float, low: float, high: float,
         marker: float | None = None) -> None:
    """A horizontal bar from 0 to ``value`` on [low, high] (clipped), with an optional marker."""
    _text(image, row, scale, label)
    top, bottom = _row_top(row, scale) + scale, _row_top(row + 1, scale) - scale
    left, right = LABEL_WIDTH * scale, image.shape[1] - 3 * scale

    def x(v: float) -> int:
        return int(round(left + (np.clip(v, low, high) - low) / (high - low) * (right - left)))

    cv2.rectangle(image, (min(x(0.0), x(value)), top + scale), (max(x(0.0), x(value)), bottom - scale), BAR, cv2.FILLED)
    cv2.rectangle(image, (left, top), (right, bottom), TEXT, 1)
    if marker is not None:
        cv2.line(image, (x(marker), top - scale // 2), (x(marker), bottom + scale // 2), EXPERT, max(2, scale // 2))


def write_mp4(images: list[np.ndarray], out_path: Path, fps: int) -> None:
    """Write BGR frames as an mp4 (``mp4v``), read it back to check it, then rename it into place."""
    height, width = images[0].shape[:2]
    with atomic_path(out_path) as tmp:
        staged = tmp.with_name(tmp.name + ".mp4")  # VideoWriter chooses the container by the suffix
        try:
            writer = cv2.VideoWriter(str(staged), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
            if not writer.isOpened():
                raise EvaluationError(f"{out_path}: OpenCV cannot write mp4v videos on this machine")
            for image in images:
                writer.write(image)
            writer.release()
            count, size = read_video_shape(staged)
            if (count, size) != (len(images), (width, height)):
                raise EvaluationError(f"{out_path}: wrote {len(images)} frames of {width}×{height} but read back "
                                      f"{count} frames of {size[0]}×{size[1]}")
            os.replace(staged, tmp)
        finally:
            staged.unlink(missing_ok=True)


def read_video_shape(path: Path) -> tuple[int, tuple[int, int]]:
    """(frames decoded, (width, height)) of a video file; (0, (0, 0)) if it cannot be opened."""
    capture = cv2.VideoCapture(str(path))
    count, size = 0, (0, 0)
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            count, size = count + 1, (frame.shape[1], frame.shape[0])
    finally:
        capture.release()
    return count, size
