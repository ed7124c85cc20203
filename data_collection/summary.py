"""``nsacdrive data info``: what a dataset folder holds, read from sidecars and small arrays."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.common.atomic import json_safe
from nsacdrive.common.seeds import format_seeds
from nsacdrive.data_collection.dataset import load_episode_records
from nsacdrive.data_collection.episode import camera_fov_of, frame_kind_of
from nsacdrive.data_collection.errors import DatasetError

ACTION_NAMES = ("steer", "gas", "brake")


@dataclass
class DatasetSummary:
    root: str
    episodes: int
    frames: int
    seeds: list[int]
    sources: dict[str, int]
    frame_kinds: dict[str, int]
    camera_fovs: dict[str, int]  # front-camera episodes per horizontal field of view ("65°": n)
    colour_presets: dict[str, int]
    renderers: dict[str, int]
    agents: dict[str, int]
    lap_finished_rate: float
    reward_mean: float
    reward_std: float
    termination_reasons: dict[str, int]
    action_stats: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["seeds"] = format_seeds(self.seeds)
        return json_safe(out)  # NaN (no rewards or laps, e.g. imported recordings) → null

    def to_text(self) -> str:
        lines = [
            f"dataset            {self.root}",
            f"episodes           {self.episodes}",
            f"frames (steps)     {self.frames}",
            f"track seeds        {format_seeds(self.seeds)}  ({len(self.seeds)} tracks)",
            f"sources            {_fmt_counts(self.sources)}",
            f"frame kinds        {_fmt_counts(self.frame_kinds)}",
            *([f"camera FOV         {_fmt_counts(self.camera_fovs)}"] if self.camera_fovs else []),
            f"agents             {_fmt_counts(self.agents)}",
            f"colour presets     {_fmt_counts(self.colour_presets)}",
            f"renderers          {_fmt_counts(self.renderers)}",
            f"episode reward     {_fmt_mean_std(self.reward_mean, self.reward_std)}",
            f"lap finished       {'-' if math.isnan(self.lap_finished_rate) else f'{100 * self.lap_finished_rate:.1f}%'}",
            f"terminations       {_fmt_counts(self.termination_reasons)}",
            "",
            f"{'actions':<10}{'':<9}{'mean':>8}{'std':>8}{'min':>8}{'max':>8}",
        ]
        for kind, stats in self.action_stats.items():
            for name in ACTION_NAMES:
                s = stats[name]
                lines.append(f"{kind:<10}{name:<9}{s['mean']:8.3f}{s['std']:8.3f}{s['min']:8.3f}{s['max']:8.3f}")
        return "\n".join(lines)


def _fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} ({v})" for k, v in sorted(counts.items())) or "-"


def _fmt_mean_std(mean: float, std: float) -> str:
    return "-" if math.isnan(mean) else f"{mean:.1f} ± {std:.1f}"


def _mean_std(values: list[Any]) -> tuple[float, float]:
    """Mean and std of the numbers among ``values`` (None where an episode has none, e.g. imported
    recordings without rewards); NaN when there are none."""
    numbers = np.array([v for v in values if v is not None], dtype=np.float64)
    numbers = numbers[np.isfinite(numbers)]
    return (float(numbers.mean()), float(numbers.std())) if len(numbers) else (math.nan, math.nan)


def _action_stats(actions: np.ndarray) -> dict[str, dict[str, float]]:
    if len(actions) == 0:
        return {name: {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0} for name in ACTION_NAMES}
    return {
        name: {
            "mean": float(actions[:, i].mean()),
            "std": float(actions[:, i].std()),
            "min": float(actions[:, i].min()),
            "max": float(actions[:, i].max()),
        }
        for i, name in enumerate(ACTION_NAMES)
    }


def summarize(root: str | Path, on_error: str = "raise") -> DatasetSummary:
    """Validate every episode in ``root`` (checksums included) and summarise it."""
    records = load_episode_records(Path(root), seeds=None, on_error=on_error)  # type: ignore[arg-type]
    if not records:
        raise DatasetError(f"{root}: no episodes found (expected <episode>.npz + <episode>.json files)")
    reward_mean, reward_std = _mean_std([r.sidecar.get("total_reward") for r in records])
    laps = [r.sidecar.get("lap_finished") for r in records]
    executed = np.concatenate([r.executed_actions for r in records])
    labels = np.concatenate([r.actions for r in records])
    return DatasetSummary(
        root=str(root),
        episodes=len(records),
        frames=sum(r.n_steps for r in records),
        seeds=sorted({int(r.sidecar["track_seed"]) for r in records}),
        sources=dict(Counter(r.sidecar["source"] for r in records)),
        frame_kinds=dict(Counter(frame_kind_of(r.sidecar) for r in records)),
        camera_fovs=dict(Counter(f"{fov:g}°" for fov in (camera_fov_of(r.sidecar) for r in records) if fov is not None)),
        colour_presets=dict(Counter(r.sidecar["colour_preset"] for r in records)),
        renderers=dict(Counter(r.sidecar.get("renderer", "?") for r in records)),
        agents=dict(Counter(r.sidecar.get("agent_spec", "?") for r in records)),
        lap_finished_rate=_mean_std([float(bool(lap)) for lap in laps if lap is not None])[0],
        reward_mean=reward_mean,
        reward_std=reward_std,
        termination_reasons=dict(Counter(r.sidecar.get("termination_reason", "?") for r in records)),
        action_stats={"executed": _action_stats(executed), "label": _action_stats(labels)},
    )
