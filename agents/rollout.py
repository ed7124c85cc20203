"""Drive one episode with any Agent: the loop shared by the recorder and agent evaluation.

:func:`drive` yields one :class:`Step` per env step, so callers decide what to keep (the
recorder keeps everything, quality evaluation keeps a few statistics) without duplicating the
control loop. Action noise, when asked for, perturbs only the executed action; the agent's own
action is kept as the label. With a ``learner`` (DAgger), the agent is the labeller and each
step executes its action with probability β and the learner's otherwise (Ross et al. 2011's
mixture policy π_i = β·π* + (1 − β)·π̂_i), while the label stays the agent's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from nsacdrive.agents.base import Agent
from nsacdrive.envs.state import PrivilegedState, privileged_state


def apply_action_noise(action: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """Gaussian noise on steer and on ONE signed pedal axis (gas − brake), clipped to the action box.

    Using a single pedal axis means noise never presses gas and brake together.
    """
    if sigma <= 0:
        return action
    steer_noise, pedal_noise = rng.normal(0.0, sigma, size=2)
    return pedal_to_car_action(np.array([action[0] + steer_noise, float(action[1] - action[2]) + pedal_noise]))


def pedal_to_car_action(action: np.ndarray) -> np.ndarray:
    """(steer, signed pedal) → CarRacing's (steer, gas, brake): gas = max(p, 0), brake = max(−p, 0), clipped to the box."""
    steer, pedal = np.clip(np.asarray(action, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return np.array([steer, max(pedal, 0.0), max(-pedal, 0.0)], dtype=np.float32)


@dataclass(frozen=True)
class Step:
    """One transition: the state/observation the agent saw, what it did, what happened."""

    observation: np.ndarray
    state: PrivilegedState
    label: np.ndarray  # the agent's own action
    executed: np.ndarray  # after noise
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    next_observation: np.ndarray
    next_state: PrivilegedState


def termination_reason(terminated: bool, truncated: bool, info: dict[str, Any]) -> str:
    """``lap_finished`` | ``left_playfield`` | ``time_limit`` (docs/driving.md#carracing-facts: episode end)."""
    if terminated:
        return "lap_finished" if info.get("lap_finished") else "left_playfield"
    return "time_limit" if truncated else "running"


def drive(
    env: gym.Env,
    agent: Agent,
    seed: int,
    noise_sigma: float = 0.0,
    noise_rng: np.random.Generator | None = None,
    learner: Agent | None = None,
    beta: float = 1.0,
) -> Iterator[Step]:
    """Reset ``env`` onto track ``seed`` and yield every step until terminated or truncated.

    ``learner``/``beta``: see the module docstring (the learner sees every step, so agents with a
    frame history stay in sync, whoever is in control).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    observation, _ = env.reset(seed=seed)
    agent.reset()
    if learner is not None:
        learner.reset()
    state = privileged_state(env)
    rng = noise_rng if noise_rng is not None else np.random.default_rng(seed)
    done = False
    while not done:
        label = np.asarray(agent.act(observation, state), dtype=np.float32)
        control = label
        if learner is not None:
            learner_action = np.asarray(learner.act(observation, state), dtype=np.float32)
            control = label if rng.random() < beta else learner_action
        executed = apply_action_noise(control, rng, noise_sigma)
        next_observation, reward, terminated, truncated, info = env.step(executed)
        next_state = privileged_state(env)
        yield Step(observation, state, label, executed, float(reward), bool(terminated), bool(truncated),
                   info, next_observation, next_state)
        observation, state = next_observation, next_state
        done = terminated or truncated
