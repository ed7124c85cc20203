"""Closed-loop speed: env steps/s with a controller in the loop vs the env alone, and evaluation
throughput with 1 and 2 workers.

Speed depends on the architecture, not on the weights, so the controller is ``runs/demo-nsac``
when ``make demo`` has trained it and otherwise an untrained controller of the same
architecture (``configs/demo.json``) saved to a temporary run folder. It drives track 42 with
the fast renderer; "env alone" replays the very actions it executed. Rows side by side: the
agent re-encoding all T frames every step (what a naive loop does) vs encoding only the newest
frame and reusing cached tokens (:class:`eval.driver.ControllerAgent`), with 20 draws and with
one. Target (issue 6): with the controller in the loop ≥ 85 % of the env-alone rate. A last
block splits the per-step cost (env step, privileged state, newest-frame encoding, head with
its draws) and shows what batching B episodes per controller call would give per env step.
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
from bench.common import median_time, print_table, replay_rate  # noqa: E402
from controllers.checkpoint import WEIGHTS_FILE, save_weights, write_config  # noqa: E402
from controllers.registry import build_controller  # noqa: E402
from controllers.training import TrainConfig  # noqa: E402
from envs.observation import preprocess_observation  # noqa: E402
from eval.closed_loop import evaluate_closed_loop  # noqa: E402
from eval.driver import ControllerAgent  # noqa: E402
from nsacdrive.atomic import atomic_write_json  # noqa: E402

DEMO_RUN = ROOT / "runs" / "demo-nsac"
STEPS = 400
SCALING_SEEDS = [42, *range(1000, 1007)]  # 8 episodes: enough to amortise the workers' start-up


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


def controller_run(folder: Path) -> Path:
    """``runs/demo-nsac`` if trained, else an untrained run of the demo architecture in ``folder``."""
    if (DEMO_RUN / WEIGHTS_FILE).exists():
        return DEMO_RUN
    config = TrainConfig.from_dict({**json.loads((ROOT / "configs" / "demo.json").read_text()), "data": "unused"})
    torch.manual_seed(0)
    write_config(folder, config.to_dict())
    save_weights(build_controller(config.model), folder / WEIGHTS_FILE)
    return folder


def in_loop_rate(agent: ControllerAgent) -> tuple[float, list[np.ndarray]]:
    from envs.car_racing import make_car_racing

    env = make_car_racing(renderer="fast", max_episode_steps=STEPS)
    torch.manual_seed(0)
    start = time.perf_counter()
    actions = [step.executed for step in drive(env, agent, seed=42)]
    return len(actions) / (time.perf_counter() - start), actions


def batched_controller_ms(agent: ControllerAgent, batch: int) -> tuple[float, float]:
    """(encoder, head) milliseconds per env step when ``batch`` episodes share one controller call."""
    frames = torch.rand(batch, 1, 3, 84, 96)
    speed = torch.full((batch, 1), 50.0) if agent.model.speed_input else None
    tokens = torch.cat([agent.model.encode(frames, speed)] * len(agent.offsets), dim=-2)
    times = agent.timestamps.expand(batch, -1)
    encode = median_time(lambda: agent.model.encode(frames, speed), repeats=20)
    head = median_time(lambda: agent.model.predict_tokens(tokens, times, samples=agent.samples), repeats=20)
    return 1e3 * encode / batch, 1e3 * head / batch


def env_step_ms(steps: int = 200) -> tuple[float, float]:
    """(env step with the fast renderer, privileged state) milliseconds per step."""
    from envs.car_racing import make_car_racing
    from envs.state import privileged_state

    env = make_car_racing(renderer="fast", max_episode_steps=steps + 1)
    env.reset(seed=42)
    action = np.array([0.0, 0.2, 0.0], dtype=np.float32)
    step = median_time(lambda: env.step(action), repeats=steps)
    state = median_time(lambda: privileged_state(env), repeats=steps)
    return 1e3 * step, 1e3 * state


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        run = controller_run(Path(scratch))
        cached = ControllerAgent(run)
        rate, actions = in_loop_rate(cached)
        in_loop = {
            f"re-encoding T frames, {cached.samples} draws": in_loop_rate(ReEncodingAgent(run))[0],
            f"cached tokens, {cached.samples} draws": rate,
            "cached tokens, 1 draw": in_loop_rate(ControllerAgent(run, samples=1))[0],
        }
        env_alone = replay_rate(actions, 42, renderer="fast")
        step_ms, state_ms = env_step_ms()
        batched = {batch: batched_controller_ms(cached, batch) for batch in (1, 8, 32)}
        throughput = {}
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                evaluate_closed_loop([run], SCALING_SEEDS, ["default"], 1, Path(folder), max_steps=STEPS,
                                     workers=workers, progress=False)
                throughput[workers] = len(SCALING_SEEDS) * STEPS / (time.perf_counter() - start)
    rows = [("env steps/s, fast renderer, env alone (1 thread)", f"{env_alone:.0f}")]
    for name, value in in_loop.items():
        rows.append((f"with {cached.train_config.model.model} in the loop: {name}", f"{value:.0f}  ({100 * value / env_alone:.0f} % of env alone)"))
    rows += [
        ("target: controller in the loop / env alone", "≥ 85 %"),
        ("per step: env step (fast renderer) / privileged state", f"{step_ms:.2f} / {state_ms:.2f} ms"),
    ]
    for batch, (encode, head) in batched.items():
        env_ms = step_ms + state_ms
        rows.append((f"per env step, {batch} episodes per controller call: encode / head",
                     f"{encode:.3f} / {head:.3f} ms  (→ {100 * env_ms / (env_ms + encode + head):.0f} % of env alone)"))
    rows += [
        (f"closed-loop evaluation steps/s, {len(SCALING_SEEDS)} episodes, 1 worker (incl. start-up)", f"{throughput[1]:.0f}"),
        (f"closed-loop evaluation steps/s, {len(SCALING_SEEDS)} episodes, 2 workers (incl. start-up)", f"{throughput[2]:.0f}  ({throughput[2] / throughput[1]:.2f}×)"),
    ]
    print_table(f"closed-loop benchmark ({'trained ' + str(DEMO_RUN.name) if run == DEMO_RUN else 'untrained demo architecture'})", rows)
    atomic_write_json(ROOT / "bench" / "results" / "closed_loop_speed.json",
                      {"env_alone": env_alone, "in_loop": in_loop, "eval_throughput": throughput,
                       "env_step_ms": step_ms, "state_ms": state_ms,
                       "batched_controller_ms": {str(b): list(v) for b, v in batched.items()}})


if __name__ == "__main__":
    main()
