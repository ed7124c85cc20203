"""The two commands of a PPO study, so every study builds them alike: train a folder with
``nsacdrive expert train``, then drive its ``best/`` with ``nsacdrive expert evaluate``."""

from __future__ import annotations

from pathlib import Path

from bench.common import NSACDRIVE_SCRIPT


def ppo_commands(obs: str, seed: int, timesteps: int, folder: Path, tracks: str, held_out: Path, *train_options: str,
                 workers: int | None = None) -> tuple[list[str], list[str]]:
    """``(train, evaluate)``: train ``folder`` on ``obs`` for ``timesteps`` decisions (``train_options``
    added), then drive ``folder/best`` on ``tracks``, its aggregate written to ``held_out``."""
    train = [NSACDRIVE_SCRIPT, "expert", "train", "--obs", obs, "--seed", str(seed), "--timesteps", str(timesteps), *train_options,
             "--out", str(folder), "--no-progress"]
    evaluate = [NSACDRIVE_SCRIPT, "expert", "evaluate", "--agent", f"ppo:{folder / 'best'}", "--seeds", tracks,
                *(["--workers", str(workers)] if workers else []), "--out", str(held_out)]
    return train, evaluate
