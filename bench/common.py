"""Helpers every bench script shares: timing, peak memory, env replay rate, table printing, recipes."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import psutil
import torch

from nsacdrive.controllers.checkpoint import WEIGHTS_FILE, save_weights, write_config
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.ood_proxies import make_perturbation
from nsacdrive.controllers.precision import set_encoder_precision
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import augment_batch, batch_loss
from nsacdrive.data_collection.dataset import network_frames, sequence_timestamps
from nsacdrive.envs.observation_kinds import observation_kind

#: ``nsacdrive`` as a command line run by this interpreter (the benches' subprocesses)
NSACDRIVE = (sys.executable, "-m", "nsacdrive.cli")
#: the ``nsacdrive`` entry point beside this interpreter, for steps a study records as it runs them
NSACDRIVE_SCRIPT = str(Path(sys.executable).with_name("nsacdrive"))


def as_recorded(command: list[str]) -> str:
    """A step run through :data:`NSACDRIVE_SCRIPT` as a results file records it: ``nsacdrive …``, shell-quoted."""
    return shlex.join(["nsacdrive", *command[1:]])


def recipe(config_path: Path, model: str | None = None) -> TrainConfig:
    """The training recipe of a JSON config file (``configs/*.json``); its data folder is not read.
    ``model``: another model under the same recipe (:meth:`TrainConfig.with_model`, as ``sweep --models``)."""
    config = TrainConfig.from_dict({**json.loads(Path(config_path).read_text()), "data": "unused"})
    return config if model is None else config.with_model(model)


def untrained_run(config: TrainConfig, folder: Path) -> Path:
    """An untrained run folder of ``config``'s architecture (seeded) in ``folder``, for timing what drives it."""
    torch.manual_seed(0)
    write_config(folder, config.to_dict())
    save_weights(build_controller(config.model), folder / WEIGHTS_FILE)
    return folder


def model_recipe(model: str) -> TrainConfig:
    """The default training recipe of model ``model`` (a registry name)."""
    return TrainConfig(data="unused", model=ModelConfig(model=model))


def training_step(config: TrainConfig, batch: int, device: torch.device | str = "cpu", twin_fraction: float | None = None,
                  channels_last: bool | None = None, augment: bool = False) -> Callable[[], None]:
    """One optimiser step of ``config``'s model on a fixed random batch, as a callable: uint8 frames as
    the data pipeline hands them, moved to ``device`` and scaled there, twins made by the recipe's
    perturbation for ``twin_fraction`` of the batch (default: the recipe's share), the encoder in the
    recipe's precision; ``channels_last`` overrides the encoder's frame layout; ``augment``: the batch
    augmented as the trainer does it (colour, the robust families, the consistency term's clean views)."""
    torch.manual_seed(0)
    device = torch.device(device)
    model = build_controller(config.model).to(device).train()
    set_encoder_precision(model, config.precision)
    if channels_last is not None:
        model.encoder.CHANNELS_LAST = channels_last
    optimizer = torch.optim.AdamW(model.parameters(), config.lr)
    kind = observation_kind(config.model.observation)
    frames = torch.randint(0, 256, (batch, config.sequence_length, *kind.frame_shape), dtype=torch.uint8)
    frames = frames.pin_memory() if device.type == "cuda" else frames
    times = recipe_timestamps(config, batch, device)
    target, speed = torch.rand(batch, 3, device=device), 30 * torch.rand(batch, config.sequence_length, device=device)
    perturb = make_perturbation(config.perturbation, torch.Generator().manual_seed(1), config.perturb_mean, config.perturb_std,
                                config.twin_fraction if twin_fraction is None else twin_fraction)

    generator = torch.Generator().manual_seed(2)

    def step() -> None:
        inputs, step_speed = network_frames(frames.to(device, non_blocking=True), kind), speed if config.model.speed_input else None
        if augment:
            loss = batch_loss(model, augment_batch(inputs, target, config, generator), times, config, perturb, step_speed)["total"]
        else:
            loss = model.training_loss(inputs, times, target, perturb=perturb, speed=step_speed)["total"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def recipe_timestamps(config: TrainConfig, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The recipe's frame timestamps (seconds before the newest frame) for ``rows`` sequences, [rows, T] on ``device``."""
    return torch.from_numpy(sequence_timestamps(config.sequence_length, config.frame_stride)).to(device).expand(rows, -1)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    timed = elapsed(fn)
    return statistics.median(timed() for _ in range(repeats))


def alternate(first: Callable[[], float], second: Callable[[], float], pairs: int) -> tuple[list[float], list[float]]:
    """What ``first()`` and ``second()`` return, called in turn ``pairs`` times: a load spike on a
    shared machine hits both sides of a pair, not one side's whole series."""
    results = [(first(), second()) for _ in range(pairs)]
    return [a for a, _ in results], [b for _, b in results]


def elapsed(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn`` as a callable that returns its wall time in seconds."""
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return timed


def paired_median_ratio(baseline: Callable[[], object], candidate: Callable[[], object], repeats: int,
                        warmup: int = 1) -> tuple[float, float, float]:
    """Median times of ``baseline`` and ``candidate`` called alternately (:func:`alternate`), and the
    median of their per-pair ratios."""
    for _ in range(warmup):
        baseline(), candidate()
    base, cand = alternate(elapsed(baseline), elapsed(candidate), repeats)
    return statistics.median(base), statistics.median(cand), statistics.median(c / b for b, c in zip(base, cand, strict=True))


@contextmanager
def timed_calls(phases: Sequence[tuple[str, object, str]]) -> Iterator[Counter[str]]:
    """Seconds spent in each ``(name, owner, attribute)`` function or method while the block runs:
    each is wrapped by a timer for this block only (a call nested in another phase counts in both)."""
    spent: Counter[str] = Counter()

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def run_timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return run_timed

    with ExitStack() as stack:
        for name, owner, attribute in phases:
            stack.enter_context(mock.patch.object(owner, attribute, timed(name, getattr(owner, attribute))))
        yield spent


def replay_rate(actions: list[np.ndarray], seed: int, make_env: Callable[..., Any] | None = None, **env_kwargs: Any) -> float:
    """Env steps/s replaying ``actions`` on track ``seed`` in an env built by ``make_env`` (default:
    :func:`nsacdrive.envs.car_racing.make_car_racing`) with ``env_kwargs``."""
    if make_env is None:
        from nsacdrive.envs.car_racing import make_car_racing as make_env  # lazy: the torch-only benches need no env

    env = make_env(max_episode_steps=len(actions) + 1, **env_kwargs)
    env.reset(seed=seed)
    rate = len(actions) / replay_seconds(env, actions)
    env.close()
    return rate


def replay_seconds(env: Any, actions: list[np.ndarray]) -> float:
    """Wall time of stepping ``env`` (already reset) through ``actions``."""
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    return time.perf_counter() - start


def paired_rates(pixel: Callable[[], float], render_free: Callable[[], float], pairs: int) -> dict[str, object]:
    """Steps/s of a pixel env and of render-free physics (each call one fresh replay of the same
    actions), alternated ``pairs`` times (:func:`alternate`): the medians, and the pixel env's share
    of render-free as the median of the paired ratios."""
    pixel_rates, free_rates = alternate(pixel, render_free, pairs)
    shares = [p / f for p, f in zip(pixel_rates, free_rates, strict=True)]
    return {"pixel": float(np.median(pixel_rates)), "render_free": float(np.median(free_rates)),
            "share": float(np.median(shares)), "share_range": [float(min(shares)), float(max(shares))], "pairs": pairs}


class PeakRss:
    """Samples the summed RSS of a process and all its children every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.process, *self.process.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.05)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def save_results(name: str, quick: bool, results: object) -> None:
    """Write ``bench/results/NAME.json`` (``NAME-quick.json`` for a smoke run) atomically and say where."""
    from pathlib import Path

    from nsacdrive.common.atomic import atomic_write_json

    root = Path(__file__).resolve().parents[1]
    out = root / "bench" / "results" / (f"{name}-quick.json" if quick else f"{name}.json")
    atomic_write_json(out, results)
    print(f"\nsaved → {out.relative_to(root)}")


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title:<{width}}  value\n{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def spread_cell(mean: float, std: float, used: int, seeds: int, digits: int = 2) -> str:
    """A table cell "mean ± std", naming how many seeds it pools when some had no value."""
    text = f"{mean:.{digits}f} ± {std:.{digits}f}"
    return text if used == seeds else f"{text} ({used} of {seeds} seeds)"
