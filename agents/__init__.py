"""Agents that drive: the Agent protocol and the privileged pure-pursuit expert."""

from agents.base import Agent
from agents.expert import PurePursuitConfig, PurePursuitExpert

__all__ = ["Agent", "PurePursuitConfig", "PurePursuitExpert"]
