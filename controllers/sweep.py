"""Several trainings (seeds × models) as tasks on the same backends as evaluation.

A sweep is a list of training configs and the run folder of each. Every training is one task of
:func:`nsacdrive.common.backends.run_tasks`: in this process, in local worker processes, or as a Ray
task on a local or multi-machine cluster. Each runs single-threaded there (as every task does), so
a config gives the same weights, byte for byte, on every backend of the same machine. Trainings
resume: a finished run returns at once, an interrupted one continues from its last epoch, so an
interrupted sweep is run again with the same command.

On a cluster, the dataset and the run folders must be at the same paths on every node (a shared
filesystem): the tasks read and write them where they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nsacdrive.common.backends import run_tasks
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer, resolve_split


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What one training of a sweep reports back (plain values: it crosses process boundaries)."""

    out: str
    model: str
    seed: int
    epochs: int
    best_val: float


def train_task(config: dict[str, Any], out: str) -> SweepResult:
    """One training of a sweep, in whatever worker the backend runs it (resumable)."""
    train_config = TrainConfig.from_dict(config)
    state = Trainer(train_config, Path(out), progress=False).fit(resume=True)
    return SweepResult(out, train_config.model.model, train_config.seed, state.epoch, float(state.best_val))


def seed_sweep(config: TrainConfig, seeds: Sequence[int], models: Sequence[str] | None, out: Path) -> list[tuple[TrainConfig, Path]]:
    """The (config, run folder) of every model × seed: ``out/<model>-s<seed>``. The split is resolved
    once here (an ``auto`` split reads the dataset) so every training uses the same tracks."""
    config = resolve_split(config)
    names = list(models) if models else [config.model.model]
    return [(dataclasses.replace(config.with_model(name), seed=seed), out / f"{name}-s{seed}")
            for name in names for seed in seeds]


def train_sweep(trainings: Sequence[tuple[TrainConfig, Path]], workers: int, backend: str = "process",
                address: str | None = None) -> Iterator[SweepResult]:
    """Train every (config, run folder); results in completion order (see :func:`run_tasks`)."""
    folders = [str(out) for _, out in trainings]
    if len(set(folders)) != len(folders):
        raise ValueError("sweep: two trainings would write the same run folder")
    return run_tasks(train_task, [(config.to_dict(), out) for (config, _), out in zip(trainings, folders, strict=True)],
                     workers, backend, address)
