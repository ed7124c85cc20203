"""The pixel PPO recipe's device check: how fast it trains here, and where an hour would take it.

    python -m bench.ppo_pixels                       # 200k decisions, updates on CUDA when present
    python -m bench.ppo_pixels --timesteps 20000     # a smoke run

Trains ``nsacdrive expert train --obs pixels`` (rl-baselines3-zoo's CarRacing recipe, updates on
CUDA when present) for ``--timesteps`` decisions into ``OUT``, reads its periodic evaluations, and
projects from the measured rate the decisions one hour reaches against the recipe's 4M; then
drives ``best/`` on tracks 1000–1019. A short run says whether the recipe fits the hour on this
machine, not whether it reaches 860: that takes the whole training. The figures, with the
device and the command, go to ``bench/results/ppo-pixels.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from bench.common import as_recorded, print_table, save_results
from bench.ppo_commands import ppo_commands
from nsacdrive.agents.ppo_config import PPOConfig
from nsacdrive.agents.ppo_curve import best_point, read_curve

HOUR_S = 3600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=200_000, help="decisions to train")
    parser.add_argument("--eval-freq", type=int, default=50_000, help="decisions between periodic evaluations")
    parser.add_argument("--out", type=Path, default=Path("runs/ppo-pixels-check"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"--out: {args.out} exists: the check times a fresh training, so give a new folder")
    train, evaluate = ppo_commands("pixels", args.seed, args.timesteps, args.out, "1000-1019", args.out / "held-out.json",
                                   "--eval-freq", str(args.eval_freq))
    subprocess.run(train, check=True)
    points = read_curve(args.out / "eval")
    if not points:
        raise SystemExit(f"{args.out / 'eval'}: no periodic evaluation was made; raise --timesteps above --eval-freq")
    subprocess.run(evaluate, check=True)
    held_out = json.loads((args.out / "held-out.json").read_text())["aggregate"]
    rate = points[-1].timesteps / points[-1].seconds  # decisions per second, evaluations included
    recipe = PPOConfig.pixels_recipe().timesteps
    best = best_point(points)
    results = {
        "commands": [as_recorded(train), as_recorded(evaluate)],
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "decisions_per_s": rate, "decisions_per_hour": rate * HOUR_S, "recipe_decisions": recipe,
        "recipe_hours": recipe / rate / HOUR_S,
        "best": {"timesteps": best.timesteps, "score_mean": best.score_mean, "lap_rate": best.lap_rate},
        "held_out_1000_1019": {key: held_out[key] for key in ("score_mean", "score_std", "lap_finished_rate")},
    }
    print_table("pixel PPO recipe", [
        ("device", results["device"]),
        ("decisions/s (evaluations included)", f"{rate:.0f}"),
        ("decisions in one hour / the recipe's", f"{rate * HOUR_S / 1e6:.2f}M / {recipe / 1e6:.0f}M"),
        ("hours for the recipe", f"{results['recipe_hours']:.2f}"),
        (f"best/ at {best.timesteps // 1000}k (own evaluations)", f"{best.score_mean:.1f}, laps {100 * best.lap_rate:.0f} %"),
        ("best/ on 1000-1019", f"{held_out['score_mean']:.1f} ± {held_out['score_std']:.1f}, laps "
                               f"{100 * held_out['lap_finished_rate']:.0f} %"),
    ])
    save_results("ppo-pixels", args.timesteps < 200_000, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
