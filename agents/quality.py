"""Agent quality on a seed list: score, lap-finished rate, centreline error (render-free when possible)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from nsacdrive.agents.registry import AGENT_KINDS, AgentKinds
from nsacdrive.agents.rollout import drive, termination_reason
from nsacdrive.common.workers import worker_pool
from nsacdrive.envs.car_racing import make_car_racing


@dataclass(frozen=True)
class EpisodeQuality:
    seed: int
    score: float
    steps: int
    lap_finished: bool
    termination_reason: str
    mean_abs_lateral_error: float
    max_abs_lateral_error: float
    off_road_fraction: float


def episode_quality(agent_spec: str, seed: int, colour_preset: str = "default",
                    agent_kinds: AgentKinds = AGENT_KINDS) -> EpisodeQuality:
    agent = agent_kinds.make(agent_spec)
    # Agents that read pixels get the fast renderer (matches stock frames, bench/renderer.py).
    env = make_car_racing(colour_preset=colour_preset, render_observations=agent.needs_pixels, renderer="fast")
    score, lateral, off_road = 0.0, [], []
    for step in drive(env, agent, seed):
        score += step.reward
        lateral.append(abs(step.next_state.lateral_error))
        off_road.append(bool(step.next_state.projection.off_road))
    env.close()
    return EpisodeQuality(
        seed=seed,
        score=score,
        steps=len(lateral),
        lap_finished=bool(step.info.get("lap_finished", False)),
        termination_reason=termination_reason(step.terminated, step.truncated, step.info),
        mean_abs_lateral_error=float(np.mean(lateral)),
        max_abs_lateral_error=float(np.max(lateral)),
        off_road_fraction=float(np.mean(off_road)),
    )


@dataclass(frozen=True)
class QualityReport:
    episodes: list[EpisodeQuality]

    @property
    def scores(self) -> np.ndarray:
        return np.array([e.score for e in self.episodes])

    def aggregate(self) -> dict[str, float]:
        scores = self.scores
        return {
            "episodes": len(self.episodes),
            "score_mean": float(scores.mean()),
            "score_std": float(scores.std()),
            "score_min": float(scores.min()),
            "lap_finished_rate": float(np.mean([e.lap_finished for e in self.episodes])),
            "score_ge_900_rate": float(np.mean(scores >= 900)),
            "mean_abs_lateral_error": float(np.mean([e.mean_abs_lateral_error for e in self.episodes])),
            "off_road_fraction": float(np.mean([e.off_road_fraction for e in self.episodes])),
        }

    def to_dict(self) -> dict[str, object]:
        return {"aggregate": self.aggregate(), "episodes": [asdict(e) for e in self.episodes]}


def evaluate_agent(agent_spec: str, seeds: list[int], colour_preset: str = "default", workers: int = 1,
                   agent_kinds: AgentKinds = AGENT_KINDS) -> QualityReport:
    """Run ``agent_spec`` once on every seed (in ``workers`` processes) and collect quality figures.

    ``agent_kinds``: the kinds the spec may name (a layer above passes its own table)."""
    agent_kinds.make(agent_spec)  # fail fast on a bad spec
    args = [(agent_spec, seed, colour_preset, agent_kinds) for seed in seeds]
    if workers <= 1:
        return QualityReport([episode_quality(*a) for a in args])
    with worker_pool(workers, episode_quality) as pool:
        return QualityReport(list(pool.map(episode_quality, *zip(*args))))
