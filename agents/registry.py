"""Agent specs on the command line (``--agent expert``) → Agent instances.

A spec is a short string so it can be stored in sidecars and sent to worker processes:
``expert`` is the tuned pure-pursuit teacher; ``controller:RUN`` drives with a trained
controller (:class:`eval.driver.ControllerAgent`).
"""

from __future__ import annotations

from collections.abc import Callable

from agents.base import Agent
from agents.expert import PurePursuitExpert


def _controller(argument: str) -> Agent:
    if not argument:
        raise ValueError("--agent: controller needs a run folder, e.g. controller:runs/nsac")
    from eval.driver import ControllerAgent  # lazy: agents must not import the training stack

    return ControllerAgent(argument)


_FACTORIES: dict[str, Callable[[str], Agent]] = {
    "expert": lambda argument: PurePursuitExpert(),
    "controller": _controller,
}


def agent_kinds() -> list[str]:
    return sorted(_FACTORIES)


def make_agent(spec: str) -> Agent:
    """Build the agent named by ``spec`` (``kind`` or ``kind:argument``)."""
    kind, _, argument = spec.partition(":")
    if kind not in _FACTORIES:
        raise ValueError(f"--agent: unknown agent {spec!r}; expected one of {', '.join(agent_kinds())}")
    return _FACTORIES[kind](argument)
