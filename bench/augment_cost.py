"""What robustness costs in training: seconds per optimiser step of a recipe against a baseline recipe.

    python -m bench.augment_cost configs/quality.json configs/quality-robust.json [--batch 32] [--pairs 15]

Both steps augment their batch as the trainer does: colour, the robust families and the
consistency term's clean views. Each also runs the recipe's model, with its input normalisation
and its perturbed twins. The steps are timed on one thread, alternated pair by pair, so a load
spike hits both sides of a pair. The ratio is the median of the per-pair ratios. A recipe's whole
training time scales with it, because batches, epochs and data loading are the same (the
robustness target: at most 1.5×).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common import paired_median_ratio, recipe, training_step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path, help="the recipe to compare against (a configs/*.json file)")
    parser.add_argument("candidates", type=Path, nargs="+", help="recipes to time against it")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=15, help="alternated pairs of steps per candidate")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = training_step(recipe(args.baseline), args.batch, augment=True)
    print(f"one thread, batch {args.batch}, {args.pairs} alternated pairs; baseline {args.baseline}")
    print(f"{'recipe':<40}{'s/step':>9}{'baseline':>10}{'ratio':>8}")
    for path in args.candidates:
        baseline_s, candidate_s, ratio = paired_median_ratio(base, training_step(recipe(path), args.batch, augment=True), args.pairs)
        print(f"{str(path):<40}{candidate_s:>9.3f}{baseline_s:>10.3f}{ratio:>7.2f}×")


if __name__ == "__main__":
    main()
