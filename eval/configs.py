"""The evaluation's config dataclasses, importable without torch.

The command line reads its option defaults from them (:func:`nsacdrive.options.config_default`),
so ``--help`` and the library cannot disagree, and it still starts without importing torch. The
modules that use them re-export them: :mod:`nsacdrive.eval.closed_loop` its ``DriveConfig``,
``EvalConfig`` and ``EpisodeKey``, :mod:`nsacdrive.eval.monitor` its ``MonitorConfig``,
:mod:`nsacdrive.eval.dagger` its ``DaggerConfig``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from nsacdrive.common.backends import BACKENDS
from nsacdrive.common.config_checks import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL,
    Range,
    check_distinct,
    check_ranges,
)
from nsacdrive.common.devices import check_device_name
from nsacdrive.envs.car_racing import FPS, MAX_EPISODE_STEPS, RENDERERS
from nsacdrive.envs.colours import validate_preset
from nsacdrive.envs.corruptions import NO_CORRUPTION, parse_corruptions
from nsacdrive.eval.misbehaviour import EventConfig
from nsacdrive.eval.modes import DEFAULT_THRESHOLD, FALLBACKS, INFERENCE_MODES, MONITOR_THRESHOLDS
from nsacdrive.eval.monitor_scores import SCORES
from nsacdrive.eval.predictor_features import PREDICTOR_SCORE, FailurePredictor


def gas_caution_fits(pedal_caution: float | None, gas_caution: float | None) -> bool:
    """Whether a gas caution k may go with ``pedal_caution``: none, or k >= 0 beside a pedal caution
    (the rule of ``DriveConfig`` and of the Udacity drive server's ``ServeConfig``)."""
    return gas_caution is None or (pedal_caution is not None and gas_caution >= 0)


#: a probability strictly between 0 and 1 (a quantile, a false-alarm rate, a confidence)
OPEN_UNIT_INTERVAL = Range(0, 1, low_open=True, high_open=True)
#: the numbers MonitorConfig's numeric fields may take (each window of ``windows_s``)
MONITOR_RANGES = {"windows_s": AT_LEAST_ONE, "smooth_steps": AT_LEAST_ONE, "warmup_steps": NON_NEGATIVE,
                  "quantile": OPEN_UNIT_INTERVAL, "false_alarm_rate": OPEN_UNIT_INTERVAL, "confidence": OPEN_UNIT_INTERVAL,
                  "strata": AT_LEAST_ONE}


@dataclass(frozen=True)
class MonitorConfig:
    """How failures are predicted and judged; times in steps of 1/50 s unless named ``_s``."""

    windows_s: tuple[int, ...] = (1, 2, 3)
    smooth_steps: int = 10
    warmup_steps: int = FPS  # CarRacing zooms in during the first second; the history fills
    threshold: str = DEFAULT_THRESHOLD
    quantile: float = 0.95
    false_alarm_rate: float = 0.05
    confidence: float = 0.9  # ``conformal``: the probability that the false-alarm rate holds on new nominal windows
    strata: int = 4
    events: EventConfig = field(default_factory=EventConfig)

    def __post_init__(self) -> None:
        if self.threshold not in MONITOR_THRESHOLDS:
            raise ValueError(f"threshold: expected one of {', '.join(MONITOR_THRESHOLDS)}, got {self.threshold!r}")
        if not self.windows_s:
            raise ValueError(f"monitor config windows_s: give at least one window (whole seconds), got {self.windows_s}")
        check_ranges(self, "monitor config", MONITOR_RANGES)


#: the numbers DriveConfig's numeric fields may take (None, where a field allows it, is always allowed);
#: ``gas_caution`` also goes with ``pedal_caution`` (:func:`gas_caution_fits`)
DRIVE_RANGES = {"max_steps": AT_LEAST_ONE, "samples": AT_LEAST_ONE, "throttle_cap": NON_NEGATIVE, "pedal_caution": NON_NEGATIVE,
                "gas_caution": NON_NEGATIVE, "monitor_smooth": AT_LEAST_ONE, "monitor_warmup": NON_NEGATIVE,
                "fallback_steps": AT_LEAST_ONE, "fallback_speed": NON_NEGATIVE, "fallback_release": Range(0, 1, low_open=True)}


@dataclass(frozen=True)
class DriveConfig:
    """How every episode of an evaluation is driven (what a worker, a video or a report re-drive needs).

    :param max_steps: episode horizon (1000 = CarRacing standard)
    :param samples: draws per prediction; None: the model's own ``predict_samples``
    :param throttle_cap: scale the gas by min(1, cap / predictive steering std); None: no cap
    :param pedal_caution: k ≥ 0: execute gas − k·σ_gas and brake + k·σ_brake (predictive stds),
        clipped to the box; None: the pedals' means
    :param gas_caution: with ``pedal_caution``, the gas's own k (0: brake + k·σ_brake alone);
        None: ``pedal_caution`` for both pedals
    :param renderer: how frames are drawn, one of :data:`nsacdrive.envs.car_racing.RENDERERS`
    :param raw: ignore each run's ``calibration.json`` (by default its predictions are recalibrated)
    :param monitor_score: a score of :data:`nsacdrive.eval.monitor_scores.SCORES` computed every step,
        smoothed over ``monitor_smooth`` steps, alarming above ``monitor_threshold`` after
        ``monitor_warmup`` steps (``nsacdrive monitor`` fits them), or ``failure_predictor``, the log-odds of
        the learned failure predictor whose weights ``monitor_predictor`` holds (``nsacdrive protocol``
        fits it); None: no monitor
    :param fallback: what an alarm does (:data:`nsacdrive.eval.modes.FALLBACKS`): ``none`` (logged
        only), ``slow`` (no gas above ``fallback_speed``, with a light brake) or ``expert`` (the
        privileged expert drives: an intervention, an upper bound no real car has), each for
        ``fallback_steps`` after the score last stood above ``fallback_release`` × the threshold (a
        lower release level than the alarm's keeps it from handing back into the failure it caught); or ``stop``, a minimal-risk manoeuvre that needs
        nothing privileged: from the first alarm on, no gas and a firm brake while the controller keeps
        steering, and the episode ends as a *safe stop* once the car stands on the road (safe, not a lap);
        or ``cascade``, a second controller (``fallback_run``) that drives while the alarm lasts
        (:mod:`nsacdrive.eval.cascade`)
    :param device: where the controller runs (``cpu``, ``cuda``, ``cuda:1``); its draws come from the
        episodes' own CPU streams either way, so a GPU drives the same episodes up to float rounding
    """

    max_steps: int = MAX_EPISODE_STEPS
    samples: int | None = None
    throttle_cap: float | None = None
    pedal_caution: float | None = None
    gas_caution: float | None = None
    renderer: str = "fast"
    raw: bool = False
    monitor_score: str | None = None
    monitor_threshold: float | None = None
    monitor_smooth: int = MonitorConfig.smooth_steps  # the monitor's defaults: its thresholds were fitted with them
    monitor_warmup: int = MonitorConfig.warmup_steps
    fallback: str = "none"
    fallback_steps: int = FPS // 10  # 0.1 s: met the fallback target on 3 seeds where 1 s over-intervened on nominal laps
    fallback_speed: float = 30.0
    fallback_release: float = 1.0  # hand back only after the score stayed at or below this share of the threshold (hysteresis)
    monitor_predictor: FailurePredictor | None = None  # the weights of monitor_score "failure_predictor"
    fallback_run: str | None = None  # the second controller of fallback "cascade"
    device: str = "cpu"
    corruption_modules: tuple[str, ...] = ()  # imported by the command and its workers, never on reading a saved config

    def __post_init__(self) -> None:
        if not gas_caution_fits(self.pedal_caution, self.gas_caution):
            raise ValueError(f"drive config gas_caution must be >= 0 and goes with pedal_caution, got {self.gas_caution} "
                             f"with pedal_caution {self.pedal_caution}")
        check_ranges(self, "drive config", DRIVE_RANGES)
        check_device_name(self.device, "drive config device", allow_auto=False)
        if self.renderer not in RENDERERS:
            raise ValueError(f"drive config renderer: expected one of {', '.join(RENDERERS)}, got {self.renderer!r}")
        if (self.monitor_score is None) != (self.monitor_threshold is None):
            raise ValueError("drive config monitor_score and monitor_threshold go together")
        if self.monitor_threshold is not None and not np.isfinite(self.monitor_threshold):
            raise ValueError(f"drive config monitor_threshold must be a finite number, got {self.monitor_threshold}")
        if isinstance(self.monitor_predictor, Mapping):  # as a saved config holds it
            object.__setattr__(self, "monitor_predictor", FailurePredictor.from_json(self.monitor_predictor, "drive config monitor_predictor"))
        if self.monitor_score is not None and self.monitor_score not in (*SCORES, PREDICTOR_SCORE):
            raise ValueError(f"drive config monitor_score: expected one of {', '.join((*SCORES, PREDICTOR_SCORE))}, "
                             f"got {self.monitor_score!r}")
        if (self.monitor_score == PREDICTOR_SCORE) != (self.monitor_predictor is not None):
            raise ValueError(f"drive config monitor_predictor goes with monitor_score {PREDICTOR_SCORE!r}, and only with it")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"drive config fallback: expected one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if (self.fallback == "cascade") != (self.fallback_run is not None):
            raise ValueError("drive config fallback_run goes with fallback 'cascade' (the run that drives while the alarm lasts), "
                             "and only with it")
        if self.fallback != "none" and self.monitor_score is None:
            raise ValueError(f"drive config fallback {self.fallback!r} needs a monitor (monitor_score and monitor_threshold)")
        object.__setattr__(self, "corruption_modules", tuple(self.corruption_modules))


@dataclass(frozen=True)
class EpisodeKey:
    run: str
    colour_preset: str
    track_seed: int
    repeat: int
    corruption: str = NO_CORRUPTION  # a FAMILY-SEVERITY of nsacdrive.envs.corruptions on the controller's frames

    @property
    def episode_id(self) -> str:
        suffix = "" if self.corruption == NO_CORRUPTION else f"_{self.corruption}"
        return f"{Path(self.run).name}_{self.colour_preset}_seed{self.track_seed:06d}_r{self.repeat}{suffix}"


def corruption_of(name: str) -> Callable[[np.ndarray, int, int], np.ndarray]:
    """The frame transform of corruption ``name`` (``none``: the frame itself)."""
    if name == NO_CORRUPTION:
        return lambda frame, seed, step: frame
    (spec,) = parse_corruptions(name, "corruption")
    return spec


def resolve_inference(inference: str, backend: str, workers: int) -> str:
    """``inline`` or ``process`` (:func:`~nsacdrive.eval.closed_loop.run_pipelined`, local worker processes only); ``auto`` picks
    ``process`` when the local machine has a core to spare for every worker's inference process
    (cores ≥ 2 × workers)."""
    if inference not in INFERENCE_MODES:
        raise ValueError(f"inference: expected one of {', '.join(INFERENCE_MODES)}, got {inference!r}")
    if inference == "process" and backend != "process":
        raise ValueError("inference 'process' needs backend 'process' (a Ray task keeps its controller inline)")
    if inference != "auto":
        return inference
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return "process" if backend == "process" and cores >= 2 * max(workers, 1) else "inline"


#: the numbers EvalConfig's numeric fields may take
EVAL_RANGES = dict.fromkeys(("repeats", "trials", "batch", "workers"), AT_LEAST_ONE)
#: ``nsacdrive eval``'s ``--workers``: the command uses a worker per core of a 2-core machine, where
#: EvalConfig's default (1) keeps a library call from starting any process
COMMAND_LINE_WORKERS = 2
#: ``nsacdrive eval``'s ``--inference``: the command places the controller by core count
#: (:func:`resolve_inference`), where EvalConfig's default (``inline``) keeps a library call from
#: starting any process
COMMAND_LINE_INFERENCE = "auto"


@dataclass(frozen=True)
class EvalConfig:
    """A closed-loop evaluation: which episodes, how each is driven, and where they run.

    Every (run, preset, seed, repeat) is one episode; ``repeats`` evaluation runs of ``trials``
    episodes per (seed, preset) each, episode repeat k = run·trials + trial seeding the controller
    RNG; success is mean ± std over the evaluation runs.

    :param runs: training run folders (their folder names must differ: episode ids use them)
    :param seeds: track seeds, the same for every run (paired episodes)
    :param colour_presets: colour presets, each driven on every seed
    :param corruptions: ``none`` and/or ``FAMILY-SEVERITY`` corruptions of the controller's frames
        (:mod:`nsacdrive.envs.corruptions`; the expert and the logs see the true state), each driven
        under every preset on every seed
    :param repeats: evaluation runs
    :param trials: episodes per (seed, preset) in each evaluation run
    :param drive: how every episode is driven (horizon, draws, throttle cap, renderer)
    :param batch: episodes driven in lockstep per controller call (:func:`~nsacdrive.eval.closed_loop.batch_groups`); part of the
        evaluation's identity like the seeds (a group's rows share one network call, whose float
        rounding may depend on the batch), so it is recorded and re-drives rebuild the same groups
    :param workers: parallel tasks (1, so a library call starts no process; ``nsacdrive eval``
        defaults to :data:`COMMAND_LINE_WORKERS`)
    :param backend: where tasks run (``nsacdrive.common.backends.run_tasks``: local processes or a
        Ray cluster); every backend gives the same episodes
    :param address: the Ray cluster to join (``backend="ray"`` only)
    :param inference: where the controller runs (:func:`resolve_inference`): ``inline`` in each
        worker's env loop, or ``process``, its own process beside each worker's, which drives two
        lockstep groups double-buffered (:func:`~nsacdrive.eval.closed_loop.run_pipelined`); both give the same episodes; or
        ``auto``, resolved once, on construction, into ``resolved_inference``; ``inline`` by default, so a
        library call starts no process (``nsacdrive eval`` defaults to :data:`COMMAND_LINE_INFERENCE`)
    """

    runs: tuple[str, ...]
    seeds: tuple[int, ...]
    colour_presets: tuple[str, ...] = ("default",)
    corruptions: tuple[str, ...] = (NO_CORRUPTION,)
    repeats: int = 1
    trials: int = 1
    drive: DriveConfig = field(default_factory=DriveConfig)
    batch: int = 8
    workers: int = 1
    backend: str = "process"
    address: str | None = None
    inference: str = "inline"
    #: ``inline`` or ``process``: ``inference`` resolved for this backend and number of workers
    resolved_inference: str = field(init=False)

    #: the fields that define the episodes; the others only choose where and how fast they run
    EPISODE_FIELDS: ClassVar[tuple[str, ...]] = ("runs", "seeds", "colour_presets", "corruptions", "repeats", "trials", "drive",
                                                 "batch")

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(str(Path(run)) for run in self.runs))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "colour_presets", tuple(self.colour_presets))
        object.__setattr__(self, "corruptions", tuple(self.corruptions))
        for name in ("runs", "seeds", "colour_presets", "corruptions"):
            if not getattr(self, name):
                raise ValueError(f"evaluation config {name}: give at least one")
        check_distinct("evaluation config", "run folder names", [Path(run).name for run in self.runs])  # also refuses a run listed twice
        check_distinct("evaluation config", "seeds", self.seeds)
        check_distinct("evaluation config", "colour_presets", self.colour_presets)
        for preset in self.colour_presets:
            validate_preset(preset)
        check_distinct("evaluation config", "corruptions", self.corruptions)
        for corruption in self.corruptions:
            corruption_of(corruption)  # a ValueError naming it, now rather than in a worker
        check_ranges(self, "evaluation config", EVAL_RANGES)
        if self.backend not in BACKENDS:
            raise ValueError(f"evaluation config backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.address is not None and self.backend != "ray":
            raise ValueError(f"evaluation config address: only used with backend 'ray', got backend {self.backend!r}")
        object.__setattr__(self, "resolved_inference", resolve_inference(self.inference, self.backend, self.workers))

    def keys(self) -> list[EpisodeKey]:
        """Every episode, in the order lockstep groups are cut from (:func:`~nsacdrive.eval.closed_loop.batch_groups`)."""
        return [EpisodeKey(run, preset, seed, repeat, corruption) for run in self.runs for preset in self.colour_presets
                for corruption in self.corruptions for seed in self.seeds for repeat in range(self.repeats * self.trials)]


#: the numbers DaggerConfig's numeric fields may take (``lr`` None: the init run's)
DAGGER_RANGES = {**dict.fromkeys(("rounds", "episodes_per_round", "epochs_per_round", "max_steps", "eval_max_steps", "workers"),
                                 AT_LEAST_ONE),
                 "lr": POSITIVE, "beta0": UNIT_INTERVAL, "beta_decay": UNIT_INTERVAL}


@dataclass(frozen=True)
class DaggerConfig:
    """Everything a DAgger run depends on (saved as ``dagger.json``)."""

    init: str  # the behaviour-cloned run every round starts from (round 0)
    expert: str = "expert"  # the agent spec that labels the visited states (the teacher of the init run's data)
    rounds: int = 3
    episodes_per_round: int = 16
    beta0: float = 0.5
    beta_decay: float = 0.5
    seeds: str | None = None  # tracks driven in the rounds; None: the init run's training seeds
    colour_presets: tuple[str, ...] = ("default",)
    epochs_per_round: int = 4
    lr: float | None = None  # fine-tuning learning rate of every round; None: the init run's
    max_steps: int = MAX_EPISODE_STEPS  # horizon of the round episodes (recorded with the learner in the loop)
    max_batches_per_epoch: int | None = None
    workers: int = 2
    seed: int = 0
    eval_seeds: str | None = None  # held-out tracks for the BC-vs-DAgger table; None: no evaluation
    eval_colour_presets: tuple[str, ...] = ("default",)
    eval_max_steps: int = MAX_EPISODE_STEPS  # horizon of the closed-loop comparison's episodes

    def __post_init__(self) -> None:
        object.__setattr__(self, "colour_presets", tuple(self.colour_presets))
        object.__setattr__(self, "eval_colour_presets", tuple(self.eval_colour_presets))
        check_ranges(self, "DAgger config", DAGGER_RANGES)

    def beta(self, round_index: int) -> float:
        """β_k of round k ≥ 1 (the probability that the expert drives a step)."""
        return self.beta0 * self.beta_decay ** (round_index - 1)
