"""The agent kinds of the evaluation layer: this package's own plus ``controller:RUN``.

``controller:RUN`` drives with a trained controller (:class:`nsacdrive.eval.driver.ControllerAgent`).
Importing this module loads no torch; the controller is imported when one is built.
"""

from __future__ import annotations

from nsacdrive.agents.base import Agent
from nsacdrive.agents.registry import AGENT_KINDS as BASE_KINDS


def controller_agent(run_dir: str) -> Agent:
    """``controller:RUN``: the best-validation controller of a training run folder."""
    if not run_dir:
        raise ValueError("--agent: controller needs a run folder, e.g. controller:runs/nsac")
    from nsacdrive.eval.driver import ControllerAgent  # lazy: torch only when a controller drives

    return ControllerAgent(run_dir)


#: Every kind a spec may name once evaluation is installed; pass it to ``collect`` and ``evaluate_agent``.
AGENT_KINDS = BASE_KINDS.with_kind("controller", controller_agent)
