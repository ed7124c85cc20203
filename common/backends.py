"""Fan independent tasks (closed-loop episodes) out over local processes or a Ray cluster.

``run_tasks(function, argument_tuples, workers, backend, address)`` calls ``function(*arguments)``
for every tuple and yields the results in completion order, so a progress bar can advance per
result. Each task runs single-threaded (``single_threaded_worker``) on every backend: episodes use
batch-1 inference, where extra threads only oversubscribe the cores, and equal thread counts keep
the backends' results identical for the same arguments.

Backends:

* ``process`` — a plain loop in this process when ``workers <= 1``, else a
  ``ProcessPoolExecutor`` of ``workers`` processes forked from a fork server that imported the
  task's module once (:func:`nsacdrive.common.workers.worker_pool`).
* ``ray`` — one Ray task per call (``num_cpus=1``), gathered with ``ray.wait``. Without an
  address (and no ``RAY_ADDRESS`` in the environment) a private local cluster of ``workers``
  CPUs is started and shut down afterwards; with ``address`` (``host:port``, ``auto`` or
  ``ray://host:port``) it connects to that cluster, whose CPUs then set the parallelism, and
  leaves it running. Ray is the optional extra ``nsacdrive[ray]``.

Ray authentication: recent Ray (2.60, the extra's minimum) turns token authentication on for
every new local cluster and keeps the token in ``~/.ray/auth_token`` (or ``RAY_AUTH_TOKEN`` /
``RAY_AUTH_TOKEN_PATH``); every Ray process reads it at start. Authentication stays on here;
before starting a local cluster the token file is created when missing, atomically and readable
by its owner only, so parallel first starts (two test workers, two evaluations) agree on one
token instead of overwriting each other's. Joining a cluster by explicit address needs
``RAY_AUTH_MODE=token`` and that cluster's token in one of those places, as for any Ray driver.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from nsacdrive.common.extras import MissingExtra
from nsacdrive.common.workers import single_threaded_worker, worker_pool

BACKENDS = ("process", "ray")
RAY_MISSING = "--backend ray needs the optional extra: pip install 'nsacdrive[ray]'"
_AUTH_ENV_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

R = TypeVar("R")


def run_tasks(function: Callable[..., R], argument_tuples: Iterable[tuple], workers: int,
              backend: str = "process", address: str | None = None) -> Iterator[R]:
    """Call ``function(*arguments)`` for every tuple; return the results in completion order.

    The arguments (and, for Ray, that it is installed) are checked at once; the work runs as the
    returned iterator is consumed. ``function`` must be importable by name in the workers (a
    module-level function), as it is pickled by reference. ``address`` is for ``backend="ray"``
    only. Stopping the iteration early (an exception, Ctrl-C) cancels the tasks not yet started.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if address is not None and backend != "ray":
        raise ValueError(f"address: only used with backend='ray', got backend={backend!r}")
    argument_tuples = list(argument_tuples)
    if backend == "ray":
        import_ray()  # fail now, not at the first result
    if not argument_tuples:
        return iter(())  # nothing to do (e.g. a resumed run): start no pool or cluster
    if backend == "ray":
        return _run_ray(function, argument_tuples, workers, address)
    if workers <= 1:
        return _run_here(function, argument_tuples)
    return _run_processes(function, argument_tuples, workers)


def import_ray() -> ModuleType:
    """The ``ray`` module, or a :class:`MissingExtra` that says how to install the extra."""
    try:
        import ray
    except ImportError as exc:
        raise MissingExtra(RAY_MISSING) from exc
    return ray


@contextmanager
def ray_cluster(workers: int, address: str | None = None) -> Iterator[ModuleType]:
    """Make sure Ray is initialised for the body; shut it down after only if started here.

    A local cluster (no ``address`` and no ``RAY_ADDRESS``) gets ``workers`` CPUs, no dashboard
    and no worker output on this terminal; a connection to an existing cluster leaves it as it is.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        _ensure_local_auth_token()
        # "local": always a fresh private cluster, never one found running on this machine.
        ray.init(address="local", num_cpus=max(1, workers), **quiet)
    else:
        ray.init(address=address, **quiet)
    try:
        yield ray
    finally:
        ray.shutdown()


def _call_single_threaded(function: Callable[..., R], arguments: tuple) -> R:
    """The body of every Ray task: the process-pool worker setup, then the call."""
    single_threaded_worker()
    return function(*arguments)


def _run_ray(function: Callable[..., R], argument_tuples: list[tuple], workers: int,
             address: str | None) -> Iterator[R]:
    with ray_cluster(workers, address) as ray:
        task = ray.remote(num_cpus=1)(_call_single_threaded)
        pending = [task.remote(function, arguments) for arguments in argument_tuples]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            for reference in pending:
                ray.cancel(reference)


def _run_processes(function: Callable[..., R], argument_tuples: list[tuple], workers: int) -> Iterator[R]:
    with worker_pool(workers, function) as pool:
        pending = {pool.submit(function, *arguments) for arguments in argument_tuples}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _run_here(function: Callable[..., R], argument_tuples: list[tuple]) -> Iterator[R]:
    """The in-process loop, with one torch thread as in the workers; the count is restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for arguments in argument_tuples:
            yield function(*arguments)
    finally:
        torch.set_num_threads(threads)


def _ensure_local_auth_token() -> None:
    """Create Ray's default token file if token auth will use it and it is missing.

    Written to a temporary file and published with ``os.link``, which fails when the file
    appeared meanwhile, so concurrent starters all end up with the first one's token.
    """
    if any(os.environ.get(name) for name in _AUTH_ENV_VARS):
        return  # the user chose the mode or the token
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mode 0600
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)
