"""Closed-loop speed: env steps/s with a controller in the loop vs the env alone, one episode at
a time and B episodes in lockstep, and evaluation throughput with 1 and 2 workers.

Speed depends on the architecture, not on the weights, so the controller is an untrained
(seeded) instance of ``configs/quality.json``: the CNN encoder and the 64-wide, 16-head NSAC of
the quality runs, reading the speed, 20 draws per prediction. It drives track 42 and its
neighbours with the fast renderer on one thread.

Rows, side by side, each against its own "env alone" — the very actions the controller
executed, replayed in the same loop without it: one episode re-encoding all T frames every
step (a naive loop); one episode with cached tokens (:class:`eval.driver.ControllerAgent`); B
episodes in lockstep with one controller call per step (:class:`eval.driver.ControllerPolicy`,
what ``nsacdrive eval --batch B`` does) — env step + reading the speed + controller, nothing
else. Stepping B envs round-robin is itself slower than one env (each has its own Box2D world
and frame buffers, so caches are cold), which is why every loop gets its own baseline. Target
(issue 6): with the controller in the loop ≥ 85 % of the env-alone rate. Then the whole
evaluator (:func:`eval.closed_loop.run_episodes`: privileged state, expert labels and the
per-step log on top) and its scaling from 1 to 2 workers.
Usage: ``python bench/closed_loop_speed.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.rollout import drive  # noqa: E402
from bench.common import print_table, replay_rate  # noqa: E402
from controllers.actions import clip_to_box  # noqa: E402
from controllers.checkpoint import WEIGHTS_FILE, save_weights, write_config  # noqa: E402
from controllers.registry import build_controller  # noqa: E402
from controllers.training import TrainConfig  # noqa: E402
from envs.car_racing import make_car_racing  # noqa: E402
from envs.observation import preprocess_observation  # noqa: E402
from envs.state import forward_speed  # noqa: E402
from eval.closed_loop import EpisodeKey, episode_generator, evaluate_closed_loop, run_episodes  # noqa: E402
from eval.driver import ControllerAgent, ControllerPolicy  # noqa: E402
from nsacdrive.atomic import atomic_write_json  # noqa: E402

STEPS = 300
CONFIG = ROOT / "configs" / "quality.json"
BATCHES = (8, 32)
SCALING_SEEDS = [42, *range(1000, 1015)]  # 16 episodes: two lockstep groups of 8, one per worker


class ReEncodingAgent(ControllerAgent):
    """The naive loop: preprocess and encode all T frames at every step (no token cache)."""

    def reset(self) -> None:
        super().reset()
        self.speeds: list[float] = []

    def predict(self, observation, speed=None):
        self.frames.append(np.asarray(observation))
        self.speeds.append(speed)
        frames = torch.from_numpy(preprocess_observation(self.sequence()))[None]
        speeds = None if speed is None else torch.tensor([[self.speeds[-len(self.frames):][i] for i in self.history_indices()]])
        self.last_prediction = self.model.predict(frames, self.timestamps, samples=self.samples, speed=speeds)
        return self.last_prediction


def untrained_run(config_path: Path, folder: Path) -> Path:
    """An untrained run of ``config_path``'s architecture (seeded) in ``folder``."""
    config = TrainConfig.from_dict({**json.loads(config_path.read_text()), "data": "unused"})
    torch.manual_seed(0)
    write_config(folder, config.to_dict())
    save_weights(build_controller(config.model), folder / WEIGHTS_FILE)
    return folder


def one_episode_rate(agent: ControllerAgent) -> tuple[float, list[np.ndarray]]:
    """Steps/s of :func:`agents.rollout.drive` with ``agent`` on track 42, and the executed actions."""
    env = make_car_racing(renderer="fast", max_episode_steps=STEPS)
    torch.manual_seed(0)
    start = time.perf_counter()
    actions = [step.executed for step in drive(env, agent, seed=42)]
    return len(actions) / (time.perf_counter() - start), actions


def lockstep_rates(run: Path, batch: int) -> tuple[float, float]:
    """Steps/s of ``batch`` envs driven in lockstep by one controller call per step (env + speed +
    controller), and of the same envs replaying the executed actions round-robin without it."""
    policy = ControllerPolicy(run)
    policy.reset_episodes(batch)
    seeds = [42 + k for k in range(batch)]
    envs = [make_car_racing(renderer="fast", max_episode_steps=STEPS) for _ in seeds]
    observations = [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds)]
    generators = [episode_generator(EpisodeKey(str(run), "default", seed, 0)) for seed in seeds]
    rows = np.arange(batch)
    executed: list[list[np.ndarray]] = [[] for _ in seeds]
    running = [True] * batch
    start = time.perf_counter()
    while any(running):
        speeds = np.array([forward_speed(env.unwrapped.car) for env in envs], dtype=np.float32)
        prediction = policy.predict_episodes(rows, np.stack(observations), speeds, generators)
        for i, env in enumerate(envs):
            if running[i]:
                action = clip_to_box(prediction.mean[i]).numpy()
                observations[i], _, terminated, truncated, _ = env.step(action)
                executed[i].append(action)
                running[i] = not (terminated or truncated)
    in_loop = sum(map(len, executed)) / (time.perf_counter() - start)
    for env, seed in zip(envs, seeds):
        env.reset(seed=seed)
    start = time.perf_counter()
    for step in range(max(map(len, executed))):
        for env, actions in zip(envs, executed):
            if step < len(actions):
                env.step(actions[step])
    return in_loop, sum(map(len, executed)) / (time.perf_counter() - start)


def evaluator_rate(run: Path, batch: int) -> float:
    """Steps/s of the whole evaluator on ``batch`` episodes in one lockstep group (one process)."""
    keys = [EpisodeKey(str(run), "default", 42 + k, 0) for k in range(batch)]
    start = time.perf_counter()
    results = run_episodes(keys, STEPS, None, None)
    return sum(record.steps for record, _ in results) / (time.perf_counter() - start)


def main() -> None:
    torch.set_num_threads(1)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        run = untrained_run(CONFIG, Path(scratch) / "quality")
        rate, actions = one_episode_rate(ControllerAgent(run))
        env_alone = replay_rate(actions, 42, renderer="fast")
        in_loop = {"1 episode, re-encoding T frames": (one_episode_rate(ReEncodingAgent(run))[0], env_alone),
                   "1 episode, cached tokens": (rate, env_alone)}
        in_loop.update({f"{b} episodes in lockstep": lockstep_rates(run, b) for b in BATCHES})
        for what, (value, alone) in in_loop.items():
            rows.append((f"controller in the loop, {what}: steps/s (env alone)",
                         f"{value:.0f} ({alone:.0f})  → {100 * value / alone:.0f} %"))
        rows.append(("target: controller in the loop / env alone", "≥ 85 %"))
        evaluator = {b: evaluator_rate(run, b) for b in BATCHES}
        for b, value in evaluator.items():
            rows.append((f"whole evaluator (state, expert labels, log), batch {b}", f"{value:.0f} steps/s"))
        throughput = {}
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                evaluate_closed_loop([run], SCALING_SEEDS, ["default"], 1, Path(folder), max_steps=STEPS,
                                     workers=workers, progress=False, batch=8)
                steps = sum(json.loads(p.read_text())["steps"] for p in (Path(folder) / "episodes").glob("*.json"))
                throughput[workers] = steps / (time.perf_counter() - start)
    rows += [
        (f"nsacdrive eval, {len(SCALING_SEEDS)} episodes, batch 8, 1 worker (incl. start-up)", f"{throughput[1]:.0f} steps/s"),
        (f"nsacdrive eval, {len(SCALING_SEEDS)} episodes, batch 8, 2 workers (incl. start-up)",
         f"{throughput[2]:.0f} steps/s  ({throughput[2] / throughput[1]:.2f}×)"),
    ]
    print_table("closed-loop benchmark (untrained configs/quality.json NSAC; speed depends on the architecture only)", rows)
    atomic_write_json(ROOT / "bench" / "results" / "closed_loop_speed.json",
                      {"in_loop": {k: {"steps_per_s": v, "env_alone": a} for k, (v, a) in in_loop.items()},
                       "evaluator": {str(b): v for b, v in evaluator.items()}, "eval_throughput": throughput, "steps": STEPS})


if __name__ == "__main__":
    main()
