"""Agent specs on the command line (``--agent expert``) → Agent instances.

A spec is a short string so it can be stored in sidecars and sent to worker processes:
``expert`` is the tuned pure-pursuit teacher; ``controller:RUN`` drives with a trained
controller (:class:`nsacdrive.eval.driver.ControllerAgent`); ``ppo:DIR`` drives with a PPO model trained by
``nsacdrive expert train`` (:class:`nsacdrive.agents.ppo.PPOAgent`).
"""

from __future__ import annotations

from collections.abc import Callable

from nsacdrive.agents.base import Agent
from nsacdrive.agents.expert import PurePursuitExpert


def _controller(argument: str) -> Agent:
    if not argument:
        raise ValueError("--agent: controller needs a run folder, e.g. controller:runs/nsac")
    from nsacdrive.eval.driver import ControllerAgent  # lazy: agents must not import the training stack

    return ControllerAgent(argument)


def _ppo(argument: str) -> Agent:
    if not argument:
        raise ValueError("--agent: ppo needs a model folder, e.g. ppo:runs/ppo-state")
    from nsacdrive.agents.ppo import PPOAgent  # lazy: stable-baselines3 is only needed for PPO agents

    return PPOAgent(argument)


_FACTORIES: dict[str, Callable[[str], Agent]] = {
    "expert": lambda argument: PurePursuitExpert(),
    "controller": _controller,
    "ppo": _ppo,
}


def agent_kinds() -> list[str]:
    return sorted(_FACTORIES)


def make_agent(spec: str) -> Agent:
    """Build the agent named by ``spec`` (``kind`` or ``kind:argument``)."""
    kind, _, argument = spec.partition(":")
    if kind not in _FACTORIES:
        raise ValueError(f"--agent: unknown agent {spec!r}; expected one of {', '.join(agent_kinds())}")
    return _FACTORIES[kind](argument)
