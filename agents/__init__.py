"""Agents that drive: the Agent protocol and the privileged pure-pursuit expert."""

from nsacdrive.agents.base import Agent
from nsacdrive.agents.expert import PurePursuitConfig, PurePursuitExpert

__all__ = ["Agent", "PurePursuitConfig", "PurePursuitExpert"]
