"""How smooth a teacher's labels are: by default the pure-pursuit teachers ``expert``,
``expert:smooth`` and ``expert:gentle``; ``--teachers`` names others (``ppo:DIR``).

Steering (the smooth teacher's lever) and braking (the gentle teacher's: a long light brake
instead of a rare hard one).

Render-free, one process. Labels are recorded on tracks 0–27 as ``make demo`` collects them:
clean, and with executed-action noise σ = 0.2 (noise stream seeded like ``nsacdrive collect``,
noise seed 0). A third condition shows the states DAgger asks about: a poor learner (the default
expert with a random steering offset in [−0.8, 0.8] held for 20 steps) drives each step with
probability 1/2, 600 steps. Quality is the clean score on the held-out tracks 1000–1099.
Results go to bench/results/teacher_smoothness.json.

Usage: ``python -m bench.teacher_smoothness [--quick] [--teachers expert,ppo:DIR] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import numpy as np  # noqa: E402

from nsacdrive.agents.expert import PurePursuitExpert  # noqa: E402
from nsacdrive.agents.quality import evaluate_agent  # noqa: E402
from nsacdrive.agents.registry import make_agent  # noqa: E402
from nsacdrive.agents.rollout import drive  # noqa: E402
from nsacdrive.common.atomic import atomic_write_json  # noqa: E402
from nsacdrive.envs.car_racing import make_car_racing  # noqa: E402
from nsacdrive.envs.state import PrivilegedState  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEACHERS = ("expert", "expert:smooth", "expert:gentle")
WHEEL_LOCK = 0.4  # rad: the front wheel joints stop here, so any |steer| >= 0.4 is full lock
BRAKING = 0.05  # brake labels above this count as braking
FULL_BRAKE = 0.8  # the teachers' brake saturates at 0.85
LABEL_TRACKS = list(range(28))  # the tracks make demo records (--quick: the first 4)


@dataclass(frozen=True)
class Condition:
    """How the labelled states are visited: action noise σ, or a poor learner mixed in with β."""

    name: str
    noise_sigma: float = 0.0
    learner_beta: float | None = None  # probability the teacher drives; None: no learner
    max_steps: int = 1000


CONDITIONS = (
    Condition("clean"),
    Condition("noise 0.2", noise_sigma=0.2),
    Condition("poor learner, beta 0.5", learner_beta=0.5, max_steps=600),
)


class WanderingLearner:
    """A poor learner for the DAgger-like condition: the default expert plus a random steering offset."""

    needs_pixels = False

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._expert = PurePursuitExpert()
        self._step, self._offset = 0, 0.0

    def reset(self) -> None:
        self._step, self._offset = 0, 0.0

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        if self._step % 20 == 0:
            self._offset = float(self._rng.uniform(-0.8, 0.8))
        self._step += 1
        action = self._expert.act(observation, state)
        action[0] = np.clip(action[0] + self._offset, -1.0, 1.0)
        return action


@dataclass(frozen=True)
class LabelledEpisode:
    steer: np.ndarray  # the teacher's steering label at every step
    gas: np.ndarray  # its gas label
    brake: np.ndarray  # and its brake label
    score: float
    lap_finished: bool
    mean_abs_lateral_error: float


def record(spec: str, seeds: list[int], condition: Condition) -> list[LabelledEpisode]:
    """One episode per seed under ``condition``, with the teacher ``spec`` labelling every step."""
    env = make_car_racing(render_observations=False, max_episode_steps=condition.max_steps)
    teacher = make_agent(spec)
    episodes = []
    for seed in seeds:
        rng = np.random.default_rng([0, seed])  # as the recorder seeds noise and mixing (noise seed 0)
        learner = WanderingLearner(seed) if condition.learner_beta is not None else None
        beta = condition.learner_beta if learner is not None else 1.0
        steps = list(drive(env, teacher, seed, condition.noise_sigma, rng, learner, beta))
        steer = np.array([step.label[0] for step in steps])
        gas = np.array([step.label[1] for step in steps])
        brake = np.array([step.label[2] for step in steps])
        lap_finished = bool(steps[-1].info.get("lap_finished", False))
        lateral = float(np.mean([abs(step.state.lateral_error) for step in steps]))
        episodes.append(LabelledEpisode(steer, gas, brake, sum(step.reward for step in steps), lap_finished, lateral))
    env.close()
    return episodes


def smoothness(episodes: list[LabelledEpisode]) -> dict[str, float]:
    """Label statistics over all steps (changes are taken within episodes only), score and laps."""
    steers = [e.steer for e in episodes]
    steer = np.concatenate(steers)
    change = np.abs(np.concatenate([np.diff(s) for s in steers]))
    flips = sum(int(np.sum(s[1:] * s[:-1] < 0)) for s in steers)
    brake = np.concatenate([e.brake for e in episodes])
    braking = brake > BRAKING
    return {
        "mean_abs_change": float(change.mean()),
        "p99_abs_change": float(np.percentile(change, 99)),
        "max_abs_change": float(change.max()),
        "change_over_0.5_pct": float(100 * np.mean(change > 0.5)),
        "saturated_pct": float(100 * np.mean(np.abs(steer) >= 0.999)),
        "wheel_lock_pct": float(100 * np.mean(np.abs(steer) >= WHEEL_LOCK)),
        "sign_flips_per_100": float(100 * flips / len(steer)),
        "mean_gas": float(np.concatenate([e.gas for e in episodes]).mean()),
        "braking_pct": float(100 * np.mean(braking)),
        "mean_brake_while_braking": float(brake[braking].mean()) if braking.any() else 0.0,
        "full_brake_pct": float(100 * np.mean(brake >= FULL_BRAKE)),
        "score_mean": float(np.mean([e.score for e in episodes])),
        "lap_finished_pct": float(100 * np.mean([e.lap_finished for e in episodes])),
        "mean_abs_lateral_error": float(np.mean([e.mean_abs_lateral_error for e in episodes])),
    }


ROWS = (
    ("mean |Δsteer| per step", "mean_abs_change", "{:.4f}"),
    ("99th percentile |Δsteer|", "p99_abs_change", "{:.3f}"),
    ("max |Δsteer|", "max_abs_change", "{:.2f}"),
    ("steps with |Δsteer| > 0.5", "change_over_0.5_pct", "{:.2f}%"),
    ("steps with |steer| = 1", "saturated_pct", "{:.2f}%"),
    ("steps with |steer| >= 0.4 (full lock)", "wheel_lock_pct", "{:.2f}%"),
    ("steer sign flips per 100 steps", "sign_flips_per_100", "{:.2f}"),
    ("mean gas", "mean_gas", "{:.2f}"),
    (f"steps braking (brake > {BRAKING})", "braking_pct", "{:.1f}%"),
    ("mean brake while braking", "mean_brake_while_braking", "{:.2f}"),
    (f"steps at full brake (>= {FULL_BRAKE})", "full_brake_pct", "{:.2f}%"),
    ("score mean", "score_mean", "{:.1f}"),
    ("lap finished", "lap_finished_pct", "{:.0f}%"),
    ("mean |lateral error|", "mean_abs_lateral_error", "{:.2f}"),
)


def print_columns(title: str, teachers: list[str], rows: list[tuple[str, ...]]) -> None:
    """A table with a name column and one column per teacher."""
    width = max(len(title), *(len(row[0]) for row in rows))
    print(f"\n{title:<{width}}" + "".join(f"  {spec:>13}" for spec in teachers))
    print("-" * width + "  " + "  ".join("-" * 13 for _ in teachers))
    for name, *values in rows:
        print(f"{name:<{width}}" + "".join(f"  {value:>13}" for value in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 training and 10 held-out tracks (a smoke run)")
    parser.add_argument("--teachers", default=",".join(TEACHERS), help="agent specs, comma-separated (e.g. expert,ppo:DIR)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default bench/results/teacher_smoothness[-quick].json)")
    args = parser.parse_args()
    teachers = args.teachers.split(",")
    seeds = LABEL_TRACKS[:4] if args.quick else LABEL_TRACKS
    held_out = list(range(1000, 1010 if args.quick else 1100))
    results: dict[str, dict[str, object]] = {spec: {} for spec in teachers}
    for condition in CONDITIONS:
        for spec in teachers:
            results[spec][condition.name] = smoothness(record(spec, seeds, condition))
        rows = [(name, *(fmt.format(results[spec][condition.name][key]) for spec in teachers)) for name, key, fmt in ROWS]
        print_columns(f"labels, tracks {seeds[0]}-{seeds[-1]}, {condition.name}", teachers, rows)
    for spec in teachers:
        results[spec]["held_out"] = evaluate_agent(spec, held_out).aggregate()
    quality = [results[spec]["held_out"] for spec in teachers]
    print_columns(f"clean driving, tracks {held_out[0]}-{held_out[-1]}", teachers, [
        ("score mean ± std", *(f"{q['score_mean']:.1f} ± {q['score_std']:.1f}" for q in quality)),
        ("score min", *(f"{q['score_min']:.1f}" for q in quality)),
        ("lap finished", *(f"{100 * q['lap_finished_rate']:.0f}%" for q in quality)),
        ("mean |lateral error|", *(f"{q['mean_abs_lateral_error']:.2f}" for q in quality)),
    ])
    out = args.out or ROOT / "bench" / "results" / ("teacher_smoothness-quick.json" if args.quick else "teacher_smoothness.json")
    atomic_write_json(out, results)
    print(f"\nsaved → {out}")


if __name__ == "__main__":
    main()
