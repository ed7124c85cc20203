"""The two commands of a PPO study, so every study builds them alike: train a folder with
``nsacdrive expert train``, then drive its ``best/`` with ``nsacdrive expert evaluate``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

#: the ``nsacdrive`` entry point beside this interpreter
NSACDRIVE = str(Path(sys.executable).with_name("nsacdrive"))


def ppo_commands(obs: str, seed: int, timesteps: int, folder: Path, tracks: str, held_out: Path, *train_options: str,
                 workers: int | None = None) -> tuple[list[str], list[str]]:
    """``(train, evaluate)``: train ``folder`` on ``obs`` for ``timesteps`` decisions (``train_options``
    added), then drive ``folder/best`` on ``tracks``, its aggregate written to ``held_out``."""
    train = [NSACDRIVE, "expert", "train", "--obs", obs, "--seed", str(seed), "--timesteps", str(timesteps), *train_options,
             "--out", str(folder), "--no-progress"]
    evaluate = [NSACDRIVE, "expert", "evaluate", "--agent", f"ppo:{folder / 'best'}", "--seeds", tracks,
                *(["--workers", str(workers)] if workers else []), "--out", str(held_out)]
    return train, evaluate


def as_recorded(command: list[str]) -> str:
    """A command as a results file records it: ``nsacdrive …``, shell-quoted."""
    return shlex.join(["nsacdrive", *command[1:]])
