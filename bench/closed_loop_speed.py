"""Closed-loop speed: env steps/s with a trained controller in the loop vs the env alone, and
evaluation throughput with 1 and 2 workers.

The controller is ``runs/demo-nsac`` (``make demo`` trains it) driving track 42 with the fast
renderer; "env alone" replays the very actions it executed. Target (issue 6): with the
controller in the loop ≥ 85 % of the env-alone rate. Usage: ``python bench/closed_loop_speed.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.rollout import drive  # noqa: E402
from bench.common import print_table  # noqa: E402
from envs.car_racing import make_car_racing  # noqa: E402
from eval.closed_loop import evaluate_closed_loop  # noqa: E402
from eval.driver import ControllerAgent  # noqa: E402
from nsacdrive.atomic import atomic_write_json  # noqa: E402

RUN = ROOT / "runs" / "demo-nsac"
STEPS = 400


def main() -> None:
    if not (RUN / "model.safetensors").exists():
        sys.exit(f"{RUN} is missing: run `make demo` first (it trains the controller this bench drives)")
    torch.set_num_threads(1)
    agent = ControllerAgent(RUN)
    env = make_car_racing(renderer="fast", max_episode_steps=STEPS)
    start = time.perf_counter()
    actions = [step.executed for step in drive(env, agent, seed=42)]
    with_controller = len(actions) / (time.perf_counter() - start)
    env.reset(seed=42)
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    env_alone = len(actions) / (time.perf_counter() - start)
    throughput = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            evaluate_closed_loop([RUN], [42, 1000, 1001, 1002], ["default"], 1, Path(folder), max_steps=STEPS,
                                 workers=workers, progress=False)
            throughput[workers] = 4 * STEPS / (time.perf_counter() - start)
    rows = [
        ("env steps/s, fast renderer, env alone (1 thread)", f"{env_alone:.0f}"),
        (f"env steps/s with NSAC in the loop ({agent.samples} draws)", f"{with_controller:.0f}"),
        ("  controller-in-loop / env alone (target ≥ 85 %)", f"{100 * with_controller / env_alone:.0f} %"),
        ("closed-loop evaluation steps/s, 1 worker", f"{throughput[1]:.0f}"),
        ("closed-loop evaluation steps/s, 2 workers", f"{throughput[2]:.0f}  ({throughput[2] / throughput[1]:.2f}×)"),
    ]
    print_table("closed-loop benchmark", rows)
    atomic_write_json(ROOT / "bench" / "results" / "closed_loop_speed.json",
                      {"env_alone": env_alone, "with_controller": with_controller, "eval_throughput": throughput})


if __name__ == "__main__":
    main()
