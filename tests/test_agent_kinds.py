"""Agent kinds: the agents layer builds its own, evaluation adds ``controller:RUN``, and the table
reaches worker processes inside the jobs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from run_fixtures import tiny_run

from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.registry import AGENT_KINDS, expert_agent, make_agent
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.eval import agent_kinds as eval_kinds


def test_the_agents_layer_builds_only_its_own_kinds():
    assert AGENT_KINDS.names == ["expert", "ppo"]
    assert isinstance(make_agent("expert"), PurePursuitExpert)
    with pytest.raises(ValueError, match="unknown agent 'controller:runs/x'; expected one of expert, ppo"):
        make_agent("controller:runs/x")


def test_evaluation_adds_the_controller_kind():
    assert eval_kinds.AGENT_KINDS.names == ["controller", "expert", "ppo"]
    with pytest.raises(ValueError, match="controller needs a run folder"):
        eval_kinds.AGENT_KINDS.make("controller:")


def test_a_kind_cannot_be_added_twice_or_named_with_a_colon():
    with pytest.raises(ValueError, match="listed twice"):
        AGENT_KINDS.with_kind("expert", expert_agent)
    with pytest.raises(ValueError, match="free of ':'"):
        AGENT_KINDS.with_kind("a:b", expert_agent)


def test_a_kind_table_pickles_by_reference():
    restored = pickle.loads(pickle.dumps(eval_kinds.AGENT_KINDS))
    assert restored == eval_kinds.AGENT_KINDS
    assert dict(restored.kinds)["controller"] is eval_kinds.controller_agent


def test_collect_refuses_a_kind_its_table_lacks_before_any_worker_starts(tmp_path):
    with pytest.raises(ValueError, match="unknown agent 'controller:"):
        collect(CollectConfig(agent=f"controller:{tmp_path}", seeds=[0], max_steps=10, workers=2), tmp_path / "data", progress=False)
    assert not (tmp_path / "data").exists()


def _actions(folder):
    return {path.name: load_episode_arrays(path)[1]["actions"] for path in sidecar_paths(folder)}


def test_a_controller_agent_records_the_same_episodes_in_worker_processes(tmp_path):
    run = tiny_run(tmp_path / "fixture")
    spec = f"controller:{run}"
    for workers, name in ((1, "here"), (2, "workers")):
        summary = collect(CollectConfig(agent=spec, seeds=[3, 4], max_steps=20, workers=workers), tmp_path / name, progress=False, agent_kinds=eval_kinds.AGENT_KINDS)
        assert summary.written == 2
    here, pooled = _actions(tmp_path / "here"), _actions(tmp_path / "workers")
    assert sorted(here) == sorted(pooled) and len(here) == 2
    for name in here:
        np.testing.assert_array_equal(here[name], pooled[name])


def test_a_sampling_controller_records_the_same_episode_whatever_ran_before_it(tmp_path):
    """NSAC draws samples: each episode gets its own stream, so worker scheduling cannot change the data."""
    run = tiny_run(tmp_path / "fixture", model="nsac")
    spec = f"controller:{run}"
    for seeds, name in (([3, 4], "forward"), ([4, 3], "backward")):
        collect(CollectConfig(agent=spec, seeds=seeds, max_steps=20, workers=1), tmp_path / name, progress=False,
                agent_kinds=eval_kinds.AGENT_KINDS)
    forward, backward = _actions(tmp_path / "forward"), _actions(tmp_path / "backward")
    assert sorted(forward) == sorted(backward) and len(forward) == 2
    for name in forward:
        np.testing.assert_array_equal(forward[name], backward[name])
