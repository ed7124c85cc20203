"""The Agent protocol: experts, humans and learned controllers are interchangeable.

The recorder and the closed-loop evaluator only ever call ``reset`` and ``act``. ``act`` gets
both the raw env observation (uint8 96×96×3; all zeros when the env runs render-free) and the
privileged state; an agent uses whichever it is entitled to (a learned controller must only
read the observation, through :func:`envs.preprocess_observation`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from nsacdrive.envs.state import PrivilegedState

#: Source labels written into episode sidecars (docs/data-format.md#sources).
AGENT_SOURCES = ("expert", "ppo", "human")


@runtime_checkable
class Agent(Protocol):
    """Anything that drives CarRacing."""

    #: short identifier written into episode sidecars, e.g. ``"pure-pursuit"``
    agent_id: str
    #: dataset ``source`` label: ``expert``, ``ppo``, ``human`` or ``dagger-round-k``
    source: str
    #: whether ``act`` needs real pixels (False lets the recorder/evaluator skip drawing)
    needs_pixels: bool

    def reset(self) -> None:
        """Forget any per-episode memory (called after every env reset)."""

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        """Return a float32 action (steer, gas, brake) within the env's action space."""

    def config(self) -> dict[str, Any]:
        """JSON-ready configuration, stored in every episode sidecar."""


def seed_agent(agent: Agent, seed: int) -> None:
    """Give ``agent`` a random stream of its own for one episode, if it draws any (agents that do
    have an optional ``seed(int)`` method): its actions then depend on the episode's seed, not on
    which episodes a worker process happened to run before."""
    seed_method = getattr(agent, "seed", None)
    if callable(seed_method):
        seed_method(seed)
