"""Episode fan-out backends (common/backends.py): Ray gives what the process backend gives.

The Ray tests share one local 2-CPU cluster per test process (module fixture). Under
``pytest -n 2`` each xdist worker that runs one of them starts its own private cluster; the
clusters do not interfere (fresh cluster per start, one shared auth token).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
import torch
from data_fixtures import normalize
from run_fixtures import tiny_run
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.common.backends import RAY_MISSING, ray_cluster, run_tasks
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop


def square_and_threads(value: int) -> tuple[int, int]:
    """A trivial task that also reports the torch thread count it ran with."""
    return value * value, torch.get_num_threads()


@pytest.fixture(scope="module")
def local_ray():
    with ray_cluster(workers=2) as ray:
        # This test module is not importable in Ray's workers: ship its functions by value.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield ray
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("ray_backend"))


def test_run_tasks_gives_the_same_single_threaded_results_on_every_backend(local_ray):
    arguments = [(value,) for value in range(5)]
    expected = [(value * value, 1) for value in range(5)]
    threads = torch.get_num_threads()
    assert list(run_tasks(square_and_threads, arguments, workers=1)) == expected
    assert torch.get_num_threads() == threads  # the in-process loop restores the caller's count
    assert sorted(run_tasks(square_and_threads, arguments, workers=2, backend="ray")) == expected
    assert local_ray.is_initialized()  # a cluster started elsewhere is left running


def test_ray_and_process_backends_drive_identical_episodes(local_ray, trained_run, tmp_path):
    config = EvalConfig(runs=[trained_run], seeds=[3, 4], drive=DriveConfig(max_steps=40))
    rows = {backend: evaluate_closed_loop(dataclasses.replace(config, workers=workers, backend=backend), tmp_path / backend, progress=False)
            for backend, workers in (("process", 1), ("ray", 2))}
    assert rows["ray"] == rows["process"] and rows["ray"][0]["episodes"] == 2 and rows["ray"][0]["failed"] == 0
    for seed in (3, 4):
        name = f"run_default_seed{seed:06d}_r0"
        process, ray = (np.load(tmp_path / backend / "episodes" / f"{name}.npz") for backend in ("process", "ray"))
        assert set(process.files) == set(ray.files)
        assert len(ray["pose"]) == 40
        for field in process.files:  # executed_action, pose and every other per-step log
            assert np.array_equal(process[field], ray[field], equal_nan=True), field  # attention: NaN for GMLE
        records = [json.loads((tmp_path / backend / "episodes" / f"{name}.json").read_text()) for backend in ("process", "ray")]
        assert records[0] == records[1]
    assert (tmp_path / "process" / "summary.csv").read_text() == (tmp_path / "ray" / "summary.csv").read_text()


def test_unknown_backend_or_stray_address_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"backend: expected one of process, ray, got 'dask'"):
        run_tasks(square_and_threads, [(1,)], workers=1, backend="dask")
    with pytest.raises(ValueError, match=r"address: only used with backend='ray'"):
        run_tasks(square_and_threads, [(1,)], workers=1, address="auto")
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), "--backend", "dask", "--out", str(tmp_path / "out")])
    text = normalize(result.output)
    assert result.exit_code == 2 and "'--backend'" in text and "'dask' is not one of 'process', 'ray'" in text


def test_missing_ray_says_how_to_install_the_extra(trained_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'nsacdrive\[ray\]'"):
        run_tasks(square_and_threads, [(1,)], workers=2, backend="ray")
    result = CliRunner().invoke(app, ["eval", str(trained_run), "--backend", "ray", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and RAY_MISSING in normalize(result.output)
