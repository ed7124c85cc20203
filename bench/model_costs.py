"""What each model costs under one recipe: a training step and a closed-loop control step, as
ratios to a baseline measured side by side.

    python -m bench.model_costs configs/quality.json:nsac configs/quality.json:gmle \\
        configs/quality.json:ensemble configs/quality-levy.json [--results]

Each argument is a recipe, optionally ``:MODEL`` for another model under the same recipe (as
``nsacdrive sweep --models`` trains it); the first is the baseline. Both steps run on one thread:

* training: the recipe's whole optimiser step at its batch size (augmentation, forward with the
  model's draws and perturbed twins, backward, AdamW) on a fixed random batch;
* control: one step of ``nsacdrive eval``'s controller (:class:`ControllerPolicy`, one episode):
  the newest frame encoded, the cached tokens of the older ones gathered, the head's prediction
  with the model's own number of draws; untrained weights, which cost what trained ones do.

The whole recipe's training is the step's ratio times the ratio of the recipes' optimiser steps
(``epochs × max_batches_per_epoch``; early stopping can only shorten it); a recipe without a batch
limit per epoch has no such count, and its cell reads "–". ``--whole-data DATA`` also times whole
``nsacdrive train --epochs N`` processes on every core (start-up, data loading and validation
included), each recipe for the same share of its epochs, baseline and candidate alternated.

Candidate and baseline steps alternate pair by pair, so a load spike hits both sides of a pair;
each ratio is the median of the per-pair ratios. ``--results`` also puts the table, with this
machine's provenance, into ``results/benchmarks.json``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.common import NSACDRIVE, paired_median_ratio, recipe, training_step, untrained_run
from bench.results import REPO, Layout, current_provenance, put_table, render
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.eval.driver import ControllerPolicy


@dataclass(frozen=True)
class Candidate:
    """A recipe file and its training config, with the model trained under it."""

    path: Path
    config: TrainConfig

    @classmethod
    def parse(cls, spec: str) -> Candidate:
        path, _, model = spec.partition(":")
        if not Path(path).is_file():
            raise SystemExit(f"{spec}: {path} is not a recipe file (configs/*.json)")
        return cls(Path(path), recipe(Path(path), model or None))

    def __str__(self) -> str:
        return f"{self.path}:{self.config.model.model}"


def control_step(config: TrainConfig, folder: Path) -> Callable[[], None]:
    """One closed-loop control step of ``config``'s model on a fixed random frame and speed."""
    controller = ControllerPolicy(untrained_run(config, folder))
    frame = np.random.default_rng(0).integers(0, 256, (1, 96, 96, 3), dtype=np.uint8)
    speed = np.array([40.0], dtype=np.float32) if controller.interface.speed_input else None

    def step() -> None:
        controller.predict_episodes([0], frame, speed)

    return step


def optimiser_steps(config: TrainConfig) -> int | None:
    """The most optimiser steps the recipe trains for; None without a batch limit per epoch."""
    return config.epochs * config.max_batches_per_epoch if config.max_batches_per_epoch else None


def recipe_ratio(step_ratio: float, config: TrainConfig, baseline: TrainConfig) -> float | None:
    """The whole recipe's training against the baseline's: the step's ratio times the steps' ratio."""
    steps, base_steps = optimiser_steps(config), optimiser_steps(baseline)
    return step_ratio * steps / base_steps if steps and base_steps else None


def whole_epochs(config: TrainConfig, share: float) -> int:
    """The epochs a whole training runs for ``share`` of the recipe's (at least one)."""
    return max(1, round(share * config.epochs))


def whole_training(candidate: Candidate, data: str, share: float, folder: Path) -> Callable[[], None]:
    """A whole ``nsacdrive train`` process of ``candidate`` for ``share`` of its recipe's epochs, into
    a fresh ``folder`` each time."""
    command = [*NSACDRIVE, "train", "--config", str(candidate.path), "--model", candidate.config.model.model,
               "--data", data, "--epochs", str(whole_epochs(candidate.config, share)), "--out", str(folder)]

    def train() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    return train


def epochs_scale(config: TrainConfig, baseline: TrainConfig, share: float) -> float:
    """What turns the ratio of two whole trainings into the ratio of the whole recipes, when rounding
    to whole epochs gave them different shares of their recipes."""
    return (config.epochs / whole_epochs(config, share)) / (baseline.epochs / whole_epochs(baseline, share))


def parameters(config: TrainConfig) -> int:
    return sum(p.numel() for p in build_controller(config.model).parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="+", help="RECIPE[:MODEL]; the first is the baseline")
    parser.add_argument("--pairs", type=int, default=15, help="alternated pairs of training steps per candidate")
    parser.add_argument("--control-pairs", type=int, default=200, help="alternated pairs of control steps per candidate")
    parser.add_argument("--whole-data", metavar="DATA",
                        help="also time whole `nsacdrive train` processes on this dataset, on every core")
    parser.add_argument("--whole-share", type=float, default=1 / 15,
                        help="the share of each recipe's epochs a whole training runs (1/15: 2 of 30)")
    parser.add_argument("--whole-pairs", type=int, default=3, help="alternated pairs of whole trainings per candidate")
    parser.add_argument("--results", action="store_true",
                        help="also put the table, with this machine's provenance, into results/benchmarks.json")
    args = parser.parse_args(argv)
    if len(args.recipes) < 2:
        parser.error("give a baseline and at least one candidate")
    if not 0 < args.whole_share <= 1:
        parser.error(f"--whole-share must be in (0, 1], got {args.whole_share}")
    base, *candidates = [Candidate.parse(spec) for spec in args.recipes]
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        base_train = training_step(base.config, base.config.batch_size, augment=True)
        base_control = control_step(base.config, Path(scratch) / "baseline")
        print(f"one thread; baseline {base}")
        width = max(len("candidate"), *(len(str(c)) for c in candidates)) + 2
        print(f"{'candidate':<{width}}{'train s/step':>14}{'ratio':>8}{'recipe':>8}{'control ms/step':>17}{'ratio':>8}")
        for index, candidate in enumerate(candidates):
            config = candidate.config
            train_base, train_s, train_ratio = paired_median_ratio(base_train, training_step(config, config.batch_size, augment=True),
                                                                   args.pairs)
            control_base, control_s, control_ratio = paired_median_ratio(
                base_control, control_step(config, Path(scratch) / f"candidate-{index}"), args.control_pairs, warmup=5)
            from_steps = recipe_ratio(train_ratio, config, base.config)
            steps_cell = "–" if from_steps is None else f"×{from_steps:.2f}"
            print(f"{str(candidate):<{width}}{train_s:>14.3f}{train_ratio:>7.2f}×{steps_cell:>8}{1e3 * control_s:>17.2f}"
                  f"{control_ratio:>7.2f}×")
            whole_cells = []
            if args.whole_data:
                whole_base, whole_s, whole_ratio = paired_median_ratio(
                    whole_training(base, args.whole_data, args.whole_share, Path(scratch) / "whole-baseline"),
                    whole_training(candidate, args.whole_data, args.whole_share, Path(scratch) / f"whole-{index}"),
                    args.whole_pairs, warmup=0)
                recipe_whole = whole_ratio * epochs_scale(config, base.config, args.whole_share)
                print(f"{'':<{width}}whole trainings: {whole_s:.1f} s against {whole_base:.1f} s, ×{whole_ratio:.2f}; "
                      f"the whole recipe ×{recipe_whole:.2f}")
                whole_cells.append(f"{whole_s:.1f} s, ×{whole_ratio:.2f}; recipe ×{recipe_whole:.2f}")
            rows.append([f"`{candidate}`", f"{parameters(config):,}", f"{train_s:.3f} s, ×{train_ratio:.2f}",
                         f"{optimiser_steps(config) or '–'}, {steps_cell}", f"{1e3 * control_s:.2f} ms, ×{control_ratio:.2f}",
                         *whole_cells])
    if args.results:
        command = shlex.join(["python", "-m", "bench.model_costs", *(sys.argv[1:] if argv is None else argv)])
        provenance = current_provenance([command], sorted({str(c.path) for c in (base, *candidates)}), [])
        put_table("benchmarks", {
            "name": "What each model costs under one recipe", "provenance": provenance,
            "caption": (f"`bench.model_costs`: one thread; a training step at the recipe's batch size (median of {args.pairs} "
                        f"alternated pairs) and one closed-loop control step with the model's own draws (median of "
                        f"{args.control_pairs} pairs), each against the baseline's measured beside it. The whole recipe's "
                        "training is the step's ratio times the ratio of optimiser steps (epochs × batches per epoch). The "
                        "baseline's row gives its own time from the last pair series."
                        + (f" Whole trainings: `nsacdrive train` processes on `{args.whole_data}` on every core, for "
                           f"{whole_epochs(base.config, args.whole_share)} of the baseline's {base.config.epochs} epochs and "
                           f"the same share of each recipe's (rounded, at least one), median of {args.whole_pairs} alternated "
                           "pairs; the whole recipe's ratio scales it back to the recipes' full epochs."
                           if args.whole_data else "")),
            "columns": ["recipe:model", "parameters", "training step, ratio", "optimiser steps, whole recipe's ratio",
                        "control step, ratio", *(["whole training, ratio; the whole recipe's"] if args.whole_data else [])],
            "rows": [[f"`{base}` (baseline)", f"{parameters(base.config):,}", f"{train_base:.3f} s",
                      f"{optimiser_steps(base.config) or '–'}", f"{1e3 * control_base:.2f} ms",
                      *([f"{whole_base:.1f} s"] if args.whole_data else [])],
                     *rows]}, REPO)
        render(Layout.of(REPO))


if __name__ == "__main__":
    main()
