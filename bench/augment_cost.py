"""What robustness costs in training: seconds per optimiser step of a recipe against a baseline recipe.

    python -m bench.augment_cost configs/quality.json configs/quality-robust.json [--batch 32] [--pairs 15] [--results]

Both steps augment their batch as the trainer does: colour, the robust families and the
consistency term's clean views. Each also runs the recipe's model, with its input normalisation
and its perturbed twins. The steps are timed on one thread, alternated pair by pair, so a load
spike hits both sides of a pair. The ratio is the median of the per-pair ratios. A recipe's whole
training time scales with it, because batches, epochs and data loading are the same (the
robustness target: at most 1.5×). ``--results`` also puts the table, with this machine's
provenance, into ``results/benchmarks.json``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from bench.common import paired_median_ratio, recipe, training_step
from bench.results import REPO, Layout, current_provenance, put_table, render


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path, help="the recipe to compare against (a configs/*.json file)")
    parser.add_argument("candidates", type=Path, nargs="+", help="recipes to time against it")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=15, help="alternated pairs of steps per candidate")
    parser.add_argument("--results", action="store_true",
                        help="also put the table, with this machine's provenance, into results/benchmarks.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = training_step(recipe(args.baseline), args.batch, augment=True)
    print(f"one thread, batch {args.batch}, {args.pairs} alternated pairs; baseline {args.baseline}")
    print(f"{'recipe':<40}{'s/step':>9}{'baseline':>10}{'ratio':>8}")
    rows = []
    for path in args.candidates:
        baseline_s, candidate_s, ratio = paired_median_ratio(base, training_step(recipe(path), args.batch, augment=True), args.pairs)
        print(f"{str(path):<40}{candidate_s:>9.3f}{baseline_s:>10.3f}{ratio:>7.2f}×")
        rows.append([f"`{path}`", f"{candidate_s:.3f} s against {baseline_s:.3f} s, ×{ratio:.2f}"])
    if args.results:
        command = shlex.join(["python", "-m", "bench.augment_cost", *(sys.argv[1:] if argv is None else argv)])
        provenance = current_provenance([command], [args.baseline, *args.candidates], [])
        put_table("benchmarks", {
            "name": "What robust augmentation costs a training step", "provenance": provenance,
            "caption": (f"`bench.augment_cost`: one thread, batch {args.batch}, each recipe's whole training step (augmentation, "
                        f"forward, backward) against `{args.baseline}`'s, median of {args.pairs} alternated pairs. The "
                        "robustness target allows ×1.5."),
            "columns": ["recipe", "seconds per step, ratio"], "rows": rows}, REPO)
        render(Layout.of(REPO))


if __name__ == "__main__":
    main()
