"""A trained controller in its own process, for double-buffered closed-loop evaluation.

In :func:`nsacdrive.eval.closed_loop.run_episodes` one process alternates between stepping a lockstep
group's envs and one controller call for them, so every step costs env + controller.
:class:`InferenceProcess` moves the controller into a child process: while the child predicts
for one group, the caller steps the envs of another (double buffering, as in Sample Factory's
sampler or SEED RL's central inference). Given a core of its own, the controller is off the
critical path and the loop runs at the pace of its envs; it is not cheaper, it runs beside them.
On a machine whose cores are all stepping envs already (``--workers`` = cores) this gains
nothing, which is why ``nsacdrive eval --inference auto`` only uses it when cores are spare.

Requests are answered in the order they were submitted, and a slot has at most one request
outstanding. Each group has a slot in the child with its own :class:`nsacdrive.eval.driver.ControllerPolicy`
(token ring) and copies of its episodes' random streams, and the child computes with the
caller's torch thread count, so a group's predictions are bit for bit those of the inline loop
(tested). A slot's frames go through shared memory (B×96×96×3 uint8 is ~0.9 MB at B = 32: through
the 64 KB pipe, the caller would block until the child, busy with the other group, read it);
the pipe carries only small messages and the predictions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nsacdrive.common.workers import adopt_environment, worker_context
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.eval.driver import ControllerInterface, ControllerPolicy

_PREDICTION_FIELDS = ("mean", "aleatoric", "epistemic", "attention", "density", "latent_mean", "latent_variance")
_EXIT_TIMEOUT_S = 10.0


class InferenceError(RuntimeError):
    """The controller failed in the inference process, or the process is gone."""


class InferenceProcess:
    """A controller run (``run_dir``) served by a child process; see the module docstring.

    ``open_group(slot, generators)`` starts a group, ``submit(slot, observations, speeds)`` sends
    its newest frames without waiting, ``collect()`` returns the oldest outstanding prediction.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, run_dir: str | Path, samples: int | None = None, threads: int | None = None, raw: bool = False,
                 device: str = "cpu") -> None:
        """Start the child and load the run there; InferenceError (with the child's reason) if it cannot."""
        context = worker_context(_serve.__module__)  # forked from a fork server, never from this process
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_serve, name=f"nsacdrive-inference-{Path(run_dir).name}", daemon=True,
                                        args=(child_end, str(run_dir), samples, threads or torch.get_num_threads(), raw, device,
                                              dict(os.environ)))
        self._process.start()
        child_end.close()
        self._frames: dict[int, tuple[SharedMemory, np.ndarray]] = {}  # slot → its shared frame buffer
        self._outstanding: list[int] = []  # slots with a request in flight, oldest first
        self.interface: ControllerInterface = self._reply()

    def open_group(self, slot: int, generators: Sequence[torch.Generator]) -> None:
        """Start slot ``slot`` afresh for a group of ``len(generators)`` episodes drawing from (copies of) these streams."""
        self._send(("open", slot, [generator.get_state() for generator in generators]))

    def submit(self, slot: int, observations: np.ndarray, speeds: np.ndarray | None) -> None:
        """Queue a prediction for every row of slot ``slot`` from its newest raw frames (and speeds)."""
        if slot in self._outstanding:
            raise RuntimeError(f"slot {slot} already has a request in flight: collect it first")
        np.copyto(self._frame_buffer(slot, observations.shape, observations.dtype), observations)
        self._send(("predict", slot, speeds))
        self._outstanding.append(slot)

    def collect(self) -> UncertainPrediction:
        """The oldest outstanding request's prediction; InferenceError if it failed."""
        if not self._outstanding:
            raise RuntimeError("collect() with no request in flight")
        self._outstanding.pop(0)
        fields, signals = self._reply()
        return UncertainPrediction(**{name: None if a is None else torch.from_numpy(a) for name, a in zip(_PREDICTION_FIELDS, fields, strict=True)},
                                   signals=None if signals is None else {k: torch.from_numpy(v) for k, v in signals.items()})

    def close(self) -> None:
        """Ask the child to exit and wait for it (killed if it does not)."""
        try:
            self._connection.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._process.join(_EXIT_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()
        for memory, _ in self._frames.values():
            memory.close()
            memory.unlink()
        self._frames.clear()

    def __enter__(self) -> "InferenceProcess":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _frame_buffer(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Slot ``slot``'s shared frame buffer, (re)made and announced to the child when the shape changes."""
        held = self._frames.get(slot)
        if held is not None and held[1].shape == shape and held[1].dtype == dtype:
            return held[1]
        memory = SharedMemory(create=True, size=max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1))
        self._send(("frames", slot, memory.name, shape, np.dtype(dtype).str))
        if held is not None:  # the child has let go of it: it handles messages in order
            held[0].close()
            held[0].unlink()
        self._frames[slot] = (memory, np.ndarray(shape, dtype, buffer=memory.buf))
        return self._frames[slot][1]

    def _send(self, message: tuple) -> None:
        try:
            self._connection.send(message)
        except (BrokenPipeError, OSError) as exc:
            raise self._gone() from exc

    def _reply(self) -> Any:
        try:
            status, payload = self._connection.recv()
        except (EOFError, OSError) as exc:
            raise self._gone() from exc
        if status == "error":
            raise InferenceError(payload)
        return payload

    def _gone(self) -> InferenceError:
        self._process.join(_EXIT_TIMEOUT_S)
        return InferenceError(f"inference process exited (exit code {self._process.exitcode})")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _serve(connection: Connection, run_dir: str, samples: int | None, threads: int, raw: bool, device: str,
           environment: dict[str, str]) -> None:
    """The child: load the run, then answer requests until told to stop (None) or the pipe closes."""
    adopt_environment(environment)  # e.g. CUDA_VISIBLE_DEVICES, read when CUDA starts here
    torch.set_num_threads(threads)
    try:
        loaded = ControllerPolicy(run_dir, samples, device=device, raw=raw)  # the run is loaded (and checked) once up front
        connection.send(("ok", loaded.interface))
    except Exception as exc:
        connection.send(("error", _describe(exc)))
        return
    policies: dict[int, ControllerPolicy] = {}  # slot → its own token ring (the first slot takes ``loaded``)
    generators: dict[int, list[torch.Generator]] = {}
    frames: dict[int, tuple[SharedMemory, np.ndarray]] = {}
    while True:
        try:
            message = connection.recv()
        except EOFError:
            message = None
        if message is None:
            for memory, _ in frames.values():
                memory.close()
            return
        kind, slot, *body = message
        if kind == "open":
            if slot not in policies:
                policies[slot] = ControllerPolicy(run_dir, samples, device=device, raw=raw) if policies else loaded
            policies[slot].reset_episodes(len(body[0]))
            generators[slot] = [torch.Generator().set_state(state) for state in body[0]]
        elif kind == "frames":
            name, shape, dtype = body
            if slot in frames:
                frames[slot][0].close()
            memory = SharedMemory(name=name)  # registered with the caller's resource tracker, which the caller unlinks from
            frames[slot] = (memory, np.ndarray(shape, np.dtype(dtype), buffer=memory.buf))
        else:
            try:
                observations, (speeds,) = frames[slot][1], body
                prediction = policies[slot].predict_episodes(np.arange(len(observations)), observations, speeds,
                                                             generators[slot])
                fields = [None if (value := getattr(prediction, name)) is None else value.numpy() for name in _PREDICTION_FIELDS]
                signals = None if prediction.signals is None else {k: v.numpy() for k, v in prediction.signals.items()}
                connection.send(("ok", (fields, signals)))
            except Exception as exc:
                connection.send(("error", _describe(exc)))
