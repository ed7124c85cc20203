"""Agent specs on the command line (``--agent expert``) → Agent instances.

A spec is a short string so it can be stored in sidecars and sent to worker processes:
``expert`` is the tuned pure-pursuit teacher. Later agents (``ppo:DIR``, learned controllers)
register here too.
"""

from __future__ import annotations

from collections.abc import Callable

from agents.base import Agent
from agents.expert import PurePursuitExpert

_FACTORIES: dict[str, Callable[[str], Agent]] = {
    "expert": lambda argument: PurePursuitExpert(),
}


def agent_kinds() -> list[str]:
    return sorted(_FACTORIES)


def make_agent(spec: str) -> Agent:
    """Build the agent named by ``spec`` (``kind`` or ``kind:argument``)."""
    kind, _, argument = spec.partition(":")
    if kind not in _FACTORIES:
        raise ValueError(f"--agent: unknown agent {spec!r}; expected one of {', '.join(agent_kinds())}")
    return _FACTORIES[kind](argument)
