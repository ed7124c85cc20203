"""DAgger (Ross, Gordon & Bagnell 2011): let the learner drive, let the expert label, retrain.

Behaviour cloning only ever sees states the expert visits; once the learner drifts it meets
states no demonstration covers, and errors compound. Round k of DAgger drives the training
tracks with the mixture policy β_k·π* + (1 − β_k)·π̂_{k−1} (per step, seeded; β_k =
``beta0``·``beta_decay``^(k−1)), records the privileged expert's labels on every visited state
as source ``dagger-round-k``, and fine-tunes π̂_{k−1} on the union of the demonstrations and all
rounds so far. The run folder holds everything and every stage resumes::

    OUT/dagger.json          the configuration (a rerun must use the same one)
    OUT/data/round-k/        the episodes recorded in round k
    OUT/runs/round-k/        the controller after round k (a normal training run)
    OUT/eval/, report.json   optional closed-loop comparison of BC (round 0) and every round
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.common.progress import progress_bar
from nsacdrive.common.seeds import parse_seeds
from nsacdrive.controllers.checkpoint import read_config
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.recorder import CollectConfig, MixingConfig, collect
from nsacdrive.envs.observation_kinds import DEFAULT_CAMERA_FOV, observation_kind
from nsacdrive.eval.agent_kinds import AGENT_KINDS
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop
from nsacdrive.eval.configs import DaggerConfig  # torch-free there: the command line reads its defaults


def round_seeds(pool: list[int], count: int, seed: int, round_index: int) -> list[int]:
    """``count`` distinct training tracks for round k, drawn reproducibly from ``pool``."""
    rng = np.random.default_rng([seed, round_index])
    chosen = rng.choice(len(pool), size=min(count, len(pool)), replace=False)
    return sorted(pool[i] for i in chosen)


class Dagger:
    """Runs (or resumes) the rounds of one DAgger folder."""

    def __init__(self, config: DaggerConfig, out_dir: str | Path, progress: bool = True) -> None:
        self.config = config
        self.out = Path(out_dir)
        self.progress = progress
        self.init_config = TrainConfig.from_dict(read_config(Path(config.init)))
        seeds = config.seeds if config.seeds is not None else self.init_config.train_seeds
        if seeds == "auto":
            raise ValueError(f"--init {config.init}: its training seeds are 'auto'; pass --seeds explicitly")
        self.seed_pool = sorted(parse_seeds(seeds, "--seeds"))
        held_out = set(parse_seeds(self.init_config.val_seeds, "val seeds")) | set(parse_seeds(self.init_config.test_seeds, "test seeds"))
        AGENT_KINDS.make(config.expert)  # fail fast on a bad teacher spec
        if Path(config.init).name.startswith("round-"):
            raise ValueError(f"--init {config.init}: rename the run folder; 'round-k' names are DAgger's own")
        if held_out & set(self.seed_pool):
            raise ValueError(f"--seeds overlaps the init run's validation/test tracks {sorted(held_out & set(self.seed_pool))}")

    def data_dir(self, k: int) -> Path:
        return self.out / "data" / f"round-{k}"

    def run_dir(self, k: int) -> Path:
        return Path(self.config.init) if k == 0 else self.out / "runs" / f"round-{k}"

    def _check_config(self) -> None:
        path = self.out / "dagger.json"
        wanted = json.loads(json.dumps(dataclasses.asdict(self.config)))
        if path.exists() and json.loads(path.read_text()) != wanted:
            raise FileExistsError(f"{path}: this folder holds a DAgger run with another configuration; choose another --out")
        atomic_write_json(path, wanted)

    def run_round(self, k: int) -> dict[str, Any]:
        """Collect round k's data with π̂_{k−1} in the loop, then fine-tune it on everything so far."""
        cfg = self.config
        mixing = MixingConfig(learner=f"controller:{self.run_dir(k - 1)}", beta=cfg.beta(k), source=f"dagger-round-{k}")
        seeds = round_seeds(self.seed_pool, cfg.episodes_per_round, cfg.seed, k)
        model = self.init_config.model
        camera_fov = DEFAULT_CAMERA_FOV if model.camera_fov is None else model.camera_fov  # the camera the learner was trained on
        recording = CollectConfig(agent=cfg.expert, seeds=seeds, colour_presets=cfg.colour_presets, max_steps=cfg.max_steps,
                                  mixing=mixing, env=observation_kind(model.observation).env, workers=cfg.workers, camera_fov=camera_fov)
        summary = collect(recording, self.data_dir(k), resume=True, progress=self.progress, agent_kinds=AGENT_KINDS)
        data = ",".join([self.init_config.data] + [str(self.data_dir(j)) for j in range(1, k + 1)])
        train_config = dataclasses.replace(self.init_config, data=data, init_from=str(self.run_dir(k - 1)),
                                           epochs=cfg.epochs_per_round, seed=cfg.seed + k,
                                           lr=self.init_config.lr if cfg.lr is None else cfg.lr,
                                           max_batches_per_epoch=cfg.max_batches_per_epoch or self.init_config.max_batches_per_epoch)
        state = Trainer(train_config, self.run_dir(k), progress=self.progress).fit(resume=True)
        return {"round": k, "beta": cfg.beta(k), "seeds": seeds, "episodes_written": summary.written,
                "steps_recorded": summary.steps, "best_val": state.best_val, "epochs": state.epoch}

    def run(self) -> dict[str, Any]:
        """All rounds, then (with ``eval_seeds``) the closed-loop table; writes ``report.json``."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_config()
        rounds = []
        for k in progress_bar(range(1, self.config.rounds + 1), desc="dagger", unit="round", disable=not self.progress):
            rounds.append(self.run_round(k))
            if self.progress:
                tqdm.write(f"round {k}: β={rounds[-1]['beta']:.3f}, {rounds[-1]['steps_recorded']} new steps, "
                           f"best validation loss {rounds[-1]['best_val']:.4f} → {self.run_dir(k)}")
        report: dict[str, Any] = {"config": dataclasses.asdict(self.config), "rounds": rounds}
        if self.config.eval_seeds:
            runs = [self.run_dir(k) for k in range(self.config.rounds + 1)]
            evaluation = EvalConfig(runs=tuple(map(str, runs)), seeds=parse_seeds(self.config.eval_seeds, "eval seeds"),
                                    colour_presets=self.config.eval_colour_presets,
                                    drive=DriveConfig(max_steps=self.config.eval_max_steps), workers=self.config.workers)
            rows = evaluate_closed_loop(evaluation, self.out / "eval", resume=True, progress=self.progress)
            names = {run.name: k for k, run in enumerate(runs)}
            report["closed_loop"] = [{"round": names[row["run"]], **row} for row in rows]
        atomic_write_json(self.out / "report.json", report)
        return report


def format_report(report: dict[str, Any]) -> str:
    """The BC-vs-DAgger table: one line per (round, colour preset)."""
    lines = [f"{'round':>5}  {'preset':<10} {'success':>8} {'score':>7} {'|lat|':>6} {'drive':>6}"]
    for row in sorted(report.get("closed_loop", []), key=lambda r: (r["round"], r["colour_preset"])):
        name = "BC" if row["round"] == 0 else f"{row['round']}"
        lines.append(f"{name:>5}  {row['colour_preset']:<10} {row['success_mean']:>8.0%} {row['score_mean']:>7.1f} "
                     f"{row['mean_abs_lateral_error']:>6.2f} {row['driving_score']:>6.2f}")
    return "\n".join(lines)
