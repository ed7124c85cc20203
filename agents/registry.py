"""Agent specs (``expert``, ``ppo:DIR``, ``KIND:ARGUMENT``) → Agent instances, through a table of kinds.

A spec is a short string, so it can be stored in sidecars; an :class:`AgentKinds` table says
which factory builds each kind. This layer fills :data:`AGENT_KINDS` with its own kinds:
``expert`` (the tuned pure-pursuit teacher; ``expert:smooth`` and ``expert:gentle`` its variants) and ``ppo:DIR``
(a model trained by ``nsacdrive expert train``, :class:`nsacdrive.agents.ppo.PPOAgent`). A layer above adds its kinds with
:meth:`AgentKinds.with_kind` (evaluation adds ``controller:RUN``) and hands its table to whatever
builds agents. Tables travel inside the jobs sent to worker processes and their factories are
pickled by reference, so a worker process builds every kind its parent could; this layer never
imports, or names, the layers above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nsacdrive.agents.base import Agent
from nsacdrive.agents.expert import PurePursuitConfig, PurePursuitExpert

#: Builds an agent from the text after ``KIND:`` (empty for a bare ``KIND``). Module-level
#: functions or classes only: worker processes import them by name.
AgentFactory = Callable[[str], Agent]

#: The pure-pursuit configs ``expert[:VARIANT]`` names (the bare spec is the default teacher).
EXPERT_CONFIGS: dict[str, Callable[[], PurePursuitConfig]] = {"": PurePursuitConfig, "smooth": PurePursuitConfig.smooth,
                                                               "gentle": PurePursuitConfig.gentle}


@dataclass(frozen=True)
class AgentKinds:
    """Agent kinds by name, each with its factory (immutable, hashable, picklable).

    :param kinds: ``(name, factory)`` pairs; a name is what a spec starts with
    """

    kinds: tuple[tuple[str, AgentFactory], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"agent kinds: names listed twice in {names}")
        if any(not name or ":" in name for name in names):
            raise ValueError(f"agent kinds: names must be non-empty and free of ':', got {names}")

    @property
    def names(self) -> list[str]:
        return sorted(name for name, _ in self.kinds)

    def with_kind(self, name: str, factory: AgentFactory) -> AgentKinds:
        """This table plus kind ``name`` (a name already in it raises ValueError)."""
        return AgentKinds((*self.kinds, (name, factory)))

    def make(self, spec: str) -> Agent:
        """Build the agent named by ``spec`` (``kind`` or ``kind:argument``)."""
        kind, _, argument = spec.partition(":")
        factories = dict(self.kinds)
        if kind not in factories:
            raise ValueError(f"--agent: unknown agent {spec!r}; expected one of {', '.join(self.names)}")
        return factories[kind](argument)


def expert_agent(variant: str) -> Agent:
    """``expert``: the tuned pure-pursuit teacher; ``expert:smooth``: its smooth variant
    (:meth:`PurePursuitConfig.smooth`); ``expert:gentle``: its gentle-braking variant
    (:meth:`PurePursuitConfig.gentle`)."""
    if variant not in EXPERT_CONFIGS:
        expected = ", ".join(f"expert:{name}" if name else "expert" for name in EXPERT_CONFIGS)
        raise ValueError(f"--agent: unknown expert variant {variant!r}; expected one of {expected}")
    return PurePursuitExpert(EXPERT_CONFIGS[variant]())


def ppo_agent(model_dir: str) -> Agent:
    """``ppo:DIR``: a PPO model trained by ``nsacdrive expert train``."""
    if not model_dir:
        raise ValueError("--agent: ppo needs a model folder, e.g. ppo:runs/ppo-state")
    from nsacdrive.agents.ppo import PPOAgent  # lazy: stable-baselines3 is only needed for PPO agents

    return PPOAgent(model_dir)


#: The kinds this layer builds by itself.
AGENT_KINDS = AgentKinds((("expert", expert_agent), ("ppo", ppo_agent)))


def make_agent(spec: str, kinds: AgentKinds = AGENT_KINDS) -> Agent:
    """Build the agent named by ``spec`` from the table ``kinds``."""
    return kinds.make(spec)
