"""Where a corruption's steering errors sit (straights or bends) and how each per-frame signal ranks
them: the probe behind the engineering notes' account of the camera roll.

    python -m bench.error_anatomy runs/cmp/nsac-s0 --data data/quality --condition camera-tilt-5

Errors are |steer error| above the clean test tracks' 90th percentile (as evaluate-offline's error
AUROC); a straight is a frame whose steering label is below ``--straight`` in magnitude. Each
signal's AUROC is errors (positive) against the rest inside the condition: 0.5 is chance, below 0.5
means the signal is *smaller* on the errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from nsacdrive.common.seeds import parse_seeds
from nsacdrive.controllers.metrics import ood_auroc
from nsacdrive.controllers.run import load_run
from nsacdrive.envs.corruptions import parse_corruptions
from nsacdrive.eval.offline import Predictions, condition_predictions, large_error_threshold


def signal_aurocs(pred: Predictions, errors: np.ndarray, clean: Predictions) -> dict[str, float]:
    """AUROC of each per-frame steering signal, errors against the rest."""
    def auroc(score: np.ndarray) -> float:
        return ood_auroc(score[~errors], score[errors]) if errors.any() and (~errors).any() else float("nan")

    signals = {"σ": pred.std[:, 0], "epistemic": pred.epistemic[:, 0], "aleatoric": pred.aleatoric[:, 0],
               "|predicted steer|": np.abs(pred.mean[:, 0])}
    if pred.density is not None and clean.density is not None:
        signals["density"] = pred.density
        in_variance_units = np.median(clean.std[:, 0] ** 2) / np.median(clean.density)  # the clean medians matched
        signals["σ² + density"] = pred.std[:, 0] ** 2 + in_variance_units * pred.density
    return {name: auroc(score) for name, score in signals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--condition", required=True, help="a corruption, FAMILY-SEVERITY")
    parser.add_argument("--samples", type=int, default=300, help="evenly spaced test sequences per condition")
    parser.add_argument("--straight", type=float, default=0.1, help="|steering label| below this is a straight")
    args = parser.parse_args()
    model, config = load_run(args.run)  # loaded once, predicted twice: clean and corrupted
    seeds = parse_seeds(config.test_seeds, "test seeds")
    clean = condition_predictions(model, config, args.data, seeds, max_samples=args.samples)
    pred = condition_predictions(model, config, args.data, seeds, corruption=parse_corruptions(args.condition, "--condition")[0],
                                 max_samples=args.samples)
    threshold = large_error_threshold(clean)[0]
    errors = np.abs(pred.target - pred.mean)[:, 0] > threshold
    straight = np.abs(pred.target[:, 0]) < args.straight
    print(f"{args.run} under {args.condition}: {errors.mean():.0%} of {len(errors)} sequences are errors; "
          f"{errors[straight].mean():.0%} of the straights ({straight.mean():.0%} of frames), {errors[~straight].mean():.0%} of the bends")
    print(f"median σ: straights {np.median(pred.std[straight, 0]):.3f}, bends {np.median(pred.std[~straight, 0]):.3f}")
    for name, value in signal_aurocs(pred, errors, clean).items():
        print(f"  error AUROC of {name:<18} {value:.2f}")


if __name__ == "__main__":
    main()
