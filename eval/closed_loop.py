"""Closed-loop evaluation: trained controllers drive held-out tracks under colour presets.

Every episode is identified by (run, colour preset, track seed, repeat) and is the same
across models (paired design): same track, same colours, and a controller RNG seeded from
(track seed, repeat). Each runs on a plain env until terminated or truncated (reason logged),
writes a per-step log (``episodes/<id>.npz``: pose, speed, signed lateral and heading error,
progress, raw predicted mean, executed action, the privileged expert's action for the same
state, aleatoric and epistemic variance per action, and — for heads that attend over the frame
sequence (NSAC) — the newest query's attention on each of the T frames, NaN otherwise; the
feature-density score of the frame when the run has ``density.safetensors``, NaN otherwise)
and a JSON record, atomically; ``--resume`` skips finished episodes. An exception or a NaN
action inside one episode is recorded as a failed episode with its reason and the evaluation
goes on.

Action post-processing (documented once): the executed action is the predictive mean clipped
to the action box; with ``DriveConfig.throttle_cap=c`` the gas is additionally scaled by
min(1, c / σ_steer), σ_steer the predictive steering std, so the car slows down when it is
unsure where to steer; with ``DriveConfig.pedal_caution=k`` the pedals act on the cautious end
of their predictive intervals, gas − k·σ_gas and brake + k·σ_brake (clipped to the box), so the
car brakes where it is unsure whether the teacher would.

Aggregates per (model, preset): success rate (lap finished) as mean ± std over evaluation runs
(``EvalConfig.repeats``; each pools ``trials`` episodes per track and preset), the
rates of score ≥ 900 and ≥ 860 (the published criterion), mean score, mean |lateral error|, and
a CARLA-style driving score = route completion (fraction of tiles visited) × 0.8^(off-road
events) × (0.5 if the car left the playfield).
"""

from __future__ import annotations

import csv
import io
import json
import math
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.rollout import termination_reason
from nsacdrive.common.atomic import atomic_path, atomic_write_bytes, atomic_write_json, remove_partial_files
from nsacdrive.common.backends import run_tasks
from nsacdrive.common.heap import keep_freed_memory
from nsacdrive.common.progress import progress_bar
from nsacdrive.common.resume import check_settings, record_settings
from nsacdrive.common.seeds import derive_seed
from nsacdrive.common.versions import write_versions
from nsacdrive.controllers.actions import cautious_pedals, clip_to_box
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.envs.corruptions import NO_CORRUPTION, import_corruption_modules
from nsacdrive.envs.observation_kinds import DEFAULT_FRAME_KIND, make_env_for, observation_kind
from nsacdrive.envs.state import privileged_state
from nsacdrive.eval.cascade import Cascade
from nsacdrive.eval.configs import (  # torch-free there: the command line reads their defaults
    DriveConfig,
    EpisodeKey,
    EvalConfig,
    corruption_of,
)
from nsacdrive.eval.driver import ControllerInterface, ControllerPolicy
from nsacdrive.eval.hand_back import HandBack, release_level
from nsacdrive.eval.monitor_scores import CURVATURE_DISTANCES, LiveMonitor
from nsacdrive.eval.predictor_features import LivePredictor

OFF_ROAD_PENALTY = 0.8
PLAYFIELD_PENALTY = 0.5
#: ``--fallback slow`` above its speed: no gas and this much brake; at or below it, gas at most SLOW_GAS.
SLOW_BRAKE = 0.2
SLOW_GAS = 0.1
#: ``--fallback stop``: the brake it holds, and the speed (world units/s) below which the car stands
STOP_BRAKE = 0.6
STOP_SPEED = 1.0
#: the end of an episode that ``--fallback stop`` brought to a standstill on the road
SAFE_STOP = "safe_stop"


@dataclass
class EpisodeRecord:
    """One closed-loop episode (a failed one has ``failed=True`` and a ``reason``)."""

    run: str
    model: str
    colour_preset: str
    track_seed: int
    repeat: int
    failed: bool
    reason: str
    steps: int = 0
    score: float = 0.0
    lap_finished: bool = False
    route_completion: float = 0.0
    mean_abs_lateral_error: float = math.nan
    max_abs_lateral_error: float = math.nan
    off_road_fraction: float = math.nan
    off_road_events: int = 0
    mean_speed: float = math.nan
    mean_steer_std: float = math.nan
    clip_rate: float = math.nan
    corruption: str = NO_CORRUPTION
    alarms: int = 0  # monitor alarm onsets
    fallback_fraction: float = 0.0  # share of steps driven by the fallback (with ``expert``: the intervention rate)

    @property
    def driving_score(self) -> float:
        if self.failed:
            return 0.0
        penalty = OFF_ROAD_PENALTY**self.off_road_events * (PLAYFIELD_PENALTY if self.reason == "left_playfield" else 1.0)
        return self.route_completion * penalty


def throttle_cap(action: np.ndarray, steer_std: float, cap: float | None) -> np.ndarray:
    """Scale gas by min(1, cap / σ_steer) (no-op when cap is None)."""
    if cap is None or steer_std <= cap:
        return action
    capped = action.copy()
    capped[1] *= cap / steer_std
    return capped


LOG_FIELDS = ("pose", "speed", "lateral_error", "heading_error", "progress", "raw_action", "executed_action",
              "expert_action", "aleatoric", "epistemic", "attention", "density", "monitor_score", "fallback")
#: Log fields that older logs lack, and their value when absent (per step).
OPTIONAL_LOG_FIELDS = {"density": math.nan, "monitor_score": math.nan, "fallback": 0.0}


def episode_generator(key: EpisodeKey) -> torch.Generator:
    """The controller's random stream of one episode, seeded from (track seed, repeat) only."""
    return torch.Generator().manual_seed(derive_seed(key.track_seed, key.repeat))


def live_monitor(drive: DriveConfig) -> LiveMonitor | LivePredictor | None:
    """What watches an episode: the learned failure predictor, one smoothed score, or nothing."""
    if drive.monitor_score is None:
        return None
    if drive.monitor_predictor is not None:
        return LivePredictor(drive.monitor_predictor, drive.monitor_threshold, drive.monitor_smooth, drive.monitor_warmup)  # type: ignore[arg-type]
    return LiveMonitor(drive.monitor_score, drive.monitor_threshold, drive.monitor_smooth, drive.monitor_warmup)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PredictionRows:
    """A lockstep group's prediction as numpy arrays, one row per episode: converted once per step
    for the whole group, so no episode pays for torch indexing and conversions of its own row."""

    mean: np.ndarray
    action: np.ndarray  # the mean clipped to the action box, float32
    std: np.ndarray  # predictive std per action
    finite: np.ndarray  # whether each row's mean is finite
    aleatoric: np.ndarray
    epistemic: np.ndarray
    attention: np.ndarray
    density: np.ndarray

    @classmethod
    def of(cls, prediction: UncertainPrediction, frames: int) -> PredictionRows:
        """``prediction`` (on the CPU) as rows; heads that do not attend over the ``frames`` frames log
        NaN attention, runs without a feature density NaN density."""
        mean = prediction.mean
        episodes = len(mean)
        attention = np.full((episodes, frames), np.nan, np.float32) if prediction.attention is None else prediction.attention.numpy()
        density = np.full(episodes, np.nan, np.float32) if prediction.density is None else prediction.density.numpy()
        return cls(mean=mean.numpy(), action=clip_to_box(mean).numpy().astype(np.float32),
                   std=torch.sqrt(prediction.total).numpy(), finite=torch.isfinite(mean).all(dim=1).numpy(),
                   aleatoric=prediction.aleatoric.numpy(), epistemic=prediction.epistemic.numpy(),
                   attention=attention, density=density)


class EpisodeDrive:
    """One episode of a lockstep group: its env, what it has seen, and its per-step log.

    Each step executes the controller's clipped mean, then the optional throttle cap, and logs
    the prediction, the state before the action and the privileged expert's action for the
    same state (``expert_action``), so traces can be compared with what the teacher would have
    done. Any exception (env fault, non-finite action) ends this episode only, as failed.
    """

    def __init__(self, key: EpisodeKey, drive: DriveConfig, interface: ControllerInterface | None) -> None:
        """``interface``: the controller's (its observation kind and camera pick the env), None when it could not be loaded."""
        observation = interface.observation if interface is not None else None
        self.key = key
        self.generator = episode_generator(key)
        self.expert = PurePursuitExpert()
        self.log: dict[str, list] = {name: [] for name in LOG_FIELDS}
        self.observation = np.zeros(observation_kind(observation or DEFAULT_FRAME_KIND).raw_shape, dtype=np.uint8)  # if the env fails
        self.speed, self.score = 0.0, 0.0
        self.terminated = self.truncated = False
        self.info: dict[str, Any] = {}
        self.error: str | None = None
        self.traceback = ""
        self.env: Any = None
        self.corrupt = corruption_of(key.corruption)
        self.drive = drive
        self.monitor = live_monitor(drive)
        self.safe_stop = False  # ``--fallback stop`` brought the car to a standstill on the road
        threshold = drive.monitor_threshold or 0.0
        self.hand_back = HandBack(drive.fallback_steps, release_level(threshold, drive.fallback_release),
                                  latch=drive.fallback == "stop")
        self.alarming = False
        self.alarms = 0
        if observation is None:
            return
        try:
            self.env = make_env_for(observation, key.colour_preset, drive.max_steps, drive.renderer, interface.camera_fov)
            self.observation = self.corrupt(self.env.reset(seed=key.track_seed)[0], key.track_seed, 0)
            self.state = privileged_state(self.env)
            self.speed = self.state.pose.forward_speed
            self.expert.reset()
        except Exception as exc:
            self.fail(exc)

    @property
    def running(self) -> bool:
        return self.error is None and not (self.terminated or self.truncated)

    def fail(self, exc: Exception) -> None:
        """End the episode as failed (called inside an ``except`` block; the first fault is kept)."""
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.traceback = traceback.format_exc()

    def step(self, rows: PredictionRows, row: int, watched: tuple[float, bool] | None = None,
             cascade_action: np.ndarray | None = None) -> None:
        """Act on row ``row`` of the group's prediction and advance the env one step. ``watched``: this
        step's :meth:`watch`, when the group already asked (a cascade needs to know who falls back);
        ``cascade_action``: the cascade's action for this episode while it falls back."""
        try:
            if not rows.finite[row]:
                raise FloatingPointError(f"non-finite action {rows.mean[row].tolist()}")
            action, std = rows.action[row].copy(), rows.std[row]
            state, log = self.state, self.log
            expert_action = self.expert.act(self.observation, state)
            score, active = watched if watched is not None else self.watch(rows, row)
            executed = cautious_pedals(throttle_cap(action, float(std[0]), self.drive.throttle_cap), std, self.drive.pedal_caution,
                                      self.drive.gas_caution)
            if active:
                executed = cascade_action if self.drive.fallback == "cascade" else self.fall_back(executed, expert_action)
            log["raw_action"].append(rows.mean[row])
            log["aleatoric"].append(rows.aleatoric[row])
            log["epistemic"].append(rows.epistemic[row])
            log["attention"].append(rows.attention[row])
            log["density"].append(float(rows.density[row]))
            log["monitor_score"].append(score)
            log["fallback"].append(float(active))
            log["executed_action"].append(executed)
            log["expert_action"].append(expert_action)
            log["pose"].append((state.pose.x, state.pose.y, state.pose.angle))
            log["speed"].append(state.pose.forward_speed)
            log["lateral_error"].append(state.lateral_error)
            log["heading_error"].append(state.heading_error)
            log["progress"].append(state.progress)
            observation, reward, self.terminated, self.truncated, self.info = self.env.step(executed)
            self.observation = self.corrupt(observation, self.key.track_seed, len(log["speed"]))
            self.score += float(reward)
            self.state = privileged_state(self.env)
            self.speed = self.state.pose.forward_speed
            if self.stopping and self.speed < STOP_SPEED and abs(self.state.lateral_error) <= self.env.unwrapped.geometry.half_width:
                self.truncated = self.safe_stop = True
        except Exception as exc:
            self.fail(exc)

    def watch(self, rows: PredictionRows, row: int) -> tuple[float, bool]:
        """This step's smoothed monitor score (NaN without a monitor) and whether the fallback acts now."""
        if self.monitor is None:
            return math.nan, False
        state = self.state
        step = {"aleatoric": rows.aleatoric[row][None], "epistemic": rows.epistemic[row][None],
                "density": np.array([float(rows.density[row])]), "attention": rows.attention[row][None],
                "raw_action": rows.mean[row][None], "speed": np.array([state.pose.forward_speed])}
        if self.drive.monitor_score == "curvature":
            ahead = self.env.unwrapped.geometry.curvature_ahead(np.array([state.progress]), CURVATURE_DISTANCES)
            step["curvature"] = np.abs(ahead).max(1)
        score, alarm = self.monitor.update(step)
        self.alarms += int(alarm and not self.alarming)
        self.alarming = alarm
        acting = self.hand_back.update(score, alarm)
        return score, self.drive.fallback != "none" and acting

    @property
    def stopping(self) -> bool:
        """Whether ``--fallback stop`` has taken the car (it never hands it back)."""
        return self.hand_back.latch and self.hand_back.active

    def fall_back(self, executed: np.ndarray, expert_action: np.ndarray) -> np.ndarray:
        """The action of the fallback in charge: the expert's, or the controller's slowed down or braking
        to a standstill (its steering kept)."""
        if self.drive.fallback == "expert":
            return np.asarray(expert_action, dtype=np.float32)
        slowed = executed.copy()
        if self.stopping:
            slowed[1], slowed[2] = 0.0, STOP_BRAKE
            return slowed
        if self.state.pose.forward_speed > self.drive.fallback_speed:
            slowed[1], slowed[2] = 0.0, max(float(slowed[2]), SLOW_BRAKE)
        else:
            slowed[1] = min(float(slowed[1]), SLOW_GAS)
        return slowed

    def result(self, model: str) -> tuple[EpisodeRecord, dict[str, np.ndarray]]:
        key = self.key
        if self.env is not None:
            self.env.close()
        if self.error is not None:
            record = EpisodeRecord(key.run, model, key.colour_preset, key.track_seed, key.repeat, failed=True, reason=self.error,
                                   corruption=key.corruption)
            return record, {"traceback": np.array(self.traceback)}
        arrays = {name: np.asarray(values, dtype=np.float32) for name, values in self.log.items()}
        base = self.env.unwrapped
        lateral = np.abs(arrays["lateral_error"])
        off_road = lateral > base.geometry.half_width
        raw = arrays["raw_action"]
        record = EpisodeRecord(
            key.run, model, key.colour_preset, key.track_seed, key.repeat, failed=False,
            reason=SAFE_STOP if self.safe_stop else termination_reason(self.terminated, self.truncated, self.info),
            steps=len(lateral), score=self.score,
            lap_finished=bool(self.info.get("lap_finished", False)),
            route_completion=float(base.tile_visited_count / len(base.track)),
            mean_abs_lateral_error=float(lateral.mean()), max_abs_lateral_error=float(lateral.max()),
            off_road_fraction=float(off_road.mean()),
            off_road_events=int(np.count_nonzero(off_road[1:] & ~off_road[:-1]) + off_road[0]),
            mean_speed=float(arrays["speed"].mean()),
            mean_steer_std=float(np.sqrt(arrays["aleatoric"][:, 0] + arrays["epistemic"][:, 0]).mean()),
            clip_rate=float(np.mean(np.any(np.abs(raw - np.clip(raw, [-1, 0, 0], [1, 1, 1])) > 0, axis=1))) if len(raw) else 0.0,
            corruption=key.corruption,
            alarms=self.alarms,
            fallback_fraction=float(arrays["fallback"].mean()) if len(raw) else 0.0,
        )
        return record, arrays


class LockstepGroup:
    """The episodes of one lockstep group between controller calls: their inputs in, the prediction out.

    The batch keeps all rows until the last episode ends (a finished episode re-sends its last
    frame), so each row's numbers depend only on the group, never on when the others finish.
    ``interface`` None (the controller could not be loaded) builds the episodes without envs, to
    be failed with :meth:`fail`.
    """

    def __init__(self, keys: Sequence[EpisodeKey], drive: DriveConfig, interface: ControllerInterface | None) -> None:
        self.interface = interface
        self.drives = [EpisodeDrive(key, drive, interface) for key in keys]
        self.generators = [drive.generator for drive in self.drives]
        self.cascade: Cascade | None = None
        if drive.fallback == "cascade" and interface is not None:
            try:
                self.cascade = Cascade(drive.fallback_run, keys, interface, drive.samples, drive.device, drive.raw)  # type: ignore[arg-type]
            except Exception as exc:  # an unreadable cascade run fails the group's episodes, not the evaluation
                self.fail(exc)

    @property
    def running(self) -> bool:
        return any(drive.running for drive in self.drives)

    @property
    def live(self) -> np.ndarray:
        """Which episodes are still running."""
        return np.array([drive.running for drive in self.drives])

    def inputs(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row's newest frame [B, …] and, for controllers that read it, measured speed [B]."""
        observations = np.stack([drive.observation for drive in self.drives])
        speeds = np.array([drive.speed for drive in self.drives], dtype=np.float32) if self.interface.speed_input else None
        return observations, speeds

    def act(self, prediction: UncertainPrediction) -> None:
        """Step every running episode on its row of ``prediction`` (with a cascade: the episodes under the
        fallback on the cascade's actions, one call for all of them)."""
        rows = PredictionRows.of(prediction, self.interface.frames)
        if self.cascade is None:
            for row, drive in enumerate(self.drives):
                if drive.running:
                    drive.step(rows, row)
            return
        running = [row for row, drive in enumerate(self.drives) if drive.running]
        watched = {row: self.drives[row].watch(rows, row) for row in running}
        for row in running:
            self.cascade.see(row, self.drives[row].observation, self.drives[row].speed)
        try:
            actions = self.cascade.act([row for row in running if watched[row][1]])
        except Exception as exc:  # a fault of the cascade's call: every running episode fails with it
            self.fail(exc)
            return
        for row in running:
            self.drives[row].step(rows, row, watched[row], actions.get(row))

    def fail(self, exc: Exception) -> None:
        """A fault of the controller call: every running episode fails with it."""
        for drive in self.drives:
            if drive.running:
                drive.fail(exc)

    def results(self) -> list[tuple[EpisodeRecord, dict[str, np.ndarray]]]:
        model = self.interface.model if self.interface else "?"
        return [drive.result(model) for drive in self.drives]


def _unloadable(keys: Sequence[EpisodeKey], drive: DriveConfig, exc: Exception) -> list[tuple[EpisodeRecord, dict]]:
    """An unreadable run fails its episodes, not the evaluation (called inside ``except``)."""
    group = LockstepGroup(keys, drive, None)
    group.fail(exc)
    return group.results()


def _one_run(keys: Sequence[EpisodeKey]) -> str:
    if len({key.run for key in keys}) != 1:
        raise ValueError(f"a lockstep group drives one run, got {sorted({key.run for key in keys})}")
    return keys[0].run


def run_episodes(keys: Sequence[EpisodeKey], drive: DriveConfig = DriveConfig(),
                 on_frame: Callable[[int, np.ndarray], None] | None = None,
                 on_policy: Callable[[Any], None] | None = None) -> list[tuple[EpisodeRecord, dict[str, np.ndarray]]]:
    """Drive a group of episodes of one run in lockstep: one controller call per step for all of them.

    Never raises: a fault fails its episode (or, in the controller call, every running one).
    The same group always gives the same episodes (:class:`LockstepGroup`). ``on_frame(i, frame)``
    receives every frame episode ``i`` acts on (videos); ``on_policy`` receives the
    :class:`nsacdrive.eval.driver.ControllerPolicy` before the first step (e.g. to hook its network).
    """
    run = _one_run(keys)
    try:
        policy = ControllerPolicy(run, samples=drive.samples, device=drive.device, raw=drive.raw)
        policy.reset_episodes(len(keys))
        if on_policy is not None:
            on_policy(policy)
    except Exception as exc:
        return _unloadable(keys, drive, exc)
    group = LockstepGroup(keys, drive, policy.interface)
    rows = np.arange(len(keys))
    while group.running:
        if on_frame is not None:
            for i, drive in enumerate(group.drives):
                if drive.running:
                    on_frame(i, drive.observation)
        policy.live = group.live
        try:
            prediction = policy.predict_episodes(rows, *group.inputs(), group.generators)
        except Exception as exc:
            group.fail(exc)
            break
        group.act(prediction)
    return group.results()


def run_pipelined(groups: Sequence[Sequence[EpisodeKey]],
                  drive: DriveConfig = DriveConfig()) -> list[list[tuple[EpisodeRecord, dict[str, np.ndarray]]]]:
    """Drive lockstep groups of one run with the controller in its own process, double-buffered.

    Every group has one request in flight: while the inference process predicts for one group,
    this process steps another's envs (:mod:`nsacdrive.eval.inference`). Each group gives exactly the
    episodes :func:`run_episodes` gives it. Never raises: a controller fault fails the running
    episodes of its group; an inference process that cannot start or dies fails every group's.
    """
    from nsacdrive.eval.inference import InferenceError, InferenceProcess

    run = _one_run([key for keys in groups for key in keys])
    try:
        server = InferenceProcess(run, drive.samples, raw=drive.raw, device=drive.device)
    except Exception as exc:
        return [_unloadable(keys, drive, exc) for keys in groups]
    with server:
        lockstep = [LockstepGroup(keys, drive, server.interface) for keys in groups]
        in_flight: deque[tuple[int, LockstepGroup]] = deque()  # submission order = reply order
        try:
            for slot, group in enumerate(lockstep):
                server.open_group(slot, group.generators)
                if group.running:
                    server.submit(slot, *group.inputs())
                    in_flight.append((slot, group))
            while in_flight:
                slot, group = in_flight.popleft()
                try:
                    prediction = server.collect()
                except InferenceError as exc:
                    group.fail(exc)
                    continue
                group.act(prediction)
                if group.running:
                    server.submit(slot, *group.inputs())
                    in_flight.append((slot, group))
        except InferenceError as exc:  # the process is gone: nothing more can be predicted
            for group in lockstep:
                group.fail(exc)
    return [group.results() for group in lockstep]


def run_episode(key: EpisodeKey, drive: DriveConfig = DriveConfig(),
                on_frame: Callable[[np.ndarray], None] | None = None,
                on_policy: Callable[[Any], None] | None = None) -> tuple[EpisodeRecord, dict[str, np.ndarray]]:
    """One episode on its own (a group of one, :func:`run_episodes`)."""
    frame_hook = None if on_frame is None else (lambda _, frame: on_frame(frame))
    return run_episodes([key], drive, frame_hook, on_policy)[0]


def _consecutive(items: Sequence[Any], size: int, run_of: Callable[[Any], str]) -> list[list[Any]]:
    """Consecutive items of the same run, ``size`` at a time."""
    chunks: list[list[Any]] = []
    for item in items:
        if chunks and run_of(chunks[-1][0]) == run_of(item) and len(chunks[-1]) < size:
            chunks[-1].append(item)
        else:
            chunks.append([item])
    return chunks


def batch_groups(keys: Sequence[EpisodeKey], batch: int) -> list[list[EpisodeKey]]:
    """Consecutive keys of the same run, ``batch`` at a time: the lockstep groups of an evaluation.

    A pure function of the key list, so a resumed or re-driven evaluation rebuilds the same groups."""
    return _consecutive(keys, batch, lambda key: key.run)


@dataclass(frozen=True)
class GroupsTask:
    """One worker task: lockstep groups of one run, how to drive them and where to write them.

    :param groups: the lockstep groups (:func:`batch_groups`), driven together when ``inference`` is ``process``
    :param drive: how every episode is driven
    :param inference: ``inline`` or ``process`` (already resolved, :func:`~nsacdrive.eval.configs.resolve_inference`)
    :param out_dir: the evaluation folder (episodes go to its ``episodes/``)
    """

    groups: tuple[tuple[EpisodeKey, ...], ...]
    drive: DriveConfig
    inference: str
    out_dir: str


def _groups_worker(task: GroupsTask) -> int:
    """Drive a task's lockstep groups (inline one after another, or double-buffered with the
    controller in its own process) and write their episodes not yet on disk; returns the number of episodes."""
    keep_freed_memory()  # every step frees and reallocates the same arrays and tensors: ~5 % of an evaluation
    import_corruption_modules(task.drive.corruption_modules)  # a worker forked before the parent imported them
    groups = task.groups
    if task.inference == "process":
        results = run_pipelined(groups, task.drive)
    else:
        results = [run_episodes(keys, task.drive) for keys in groups]
    folder = Path(task.out_dir) / "episodes"
    for keys, group_results in zip(groups, results):
        group = [[k.colour_preset, k.track_seed, k.repeat, k.corruption] for k in keys]
        for key, (record, arrays) in zip(keys, group_results):
            if (folder / f"{key.episode_id}.json").exists():
                continue  # finished before a resume; the group re-drives it identically
            with atomic_path(folder / f"{key.episode_id}.npz") as tmp:
                with open(tmp, "wb") as handle:
                    np.savez_compressed(handle, **arrays)
            data = {**asdict(record), "driving_score": record.driving_score, "episode_id": key.episode_id,
                    "batch_group": group}
            atomic_write_json(folder / f"{key.episode_id}.json", data)
    return sum(map(len, groups))


def aggregate(records: list[dict[str, Any]], trials: int = 1) -> list[dict[str, Any]]:
    """Per (model, run, preset, corruption): success mean ± std over evaluation runs and the other aggregates.

    Episode ``repeat`` k belongs to evaluation run k // ``trials`` (each run pools its trials).
    ``faults`` (also under its old name ``failed``) counts episodes an exception ended, not the
    driving; ``laps`` the finished laps, ``safe_stops`` the episodes ``--fallback stop`` ended standing
    on the road, and ``off_road_events`` the times a car left the road, over the episodes driven to
    their end."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        key = (r["model"], Path(r["run"]).name, r["colour_preset"], r.get("corruption", NO_CORRUPTION))
        groups.setdefault(key, []).append(r)
    rows = []
    for (model, run, preset, corruption), items in sorted(groups.items()):
        runs = sorted({r["repeat"] // trials for r in items})
        per_run = [np.mean([r["lap_finished"] for r in items if r["repeat"] // trials == k]) for k in runs]
        scores = np.array([r["score"] for r in items])
        ok = [r for r in items if not r["failed"]]
        rows.append({
            "model": model, "run": run, "colour_preset": preset, "corruption": corruption,
            "episodes": len(items), "failed": len(items) - len(ok), "faults": len(items) - len(ok),
            "laps": sum(bool(r["lap_finished"]) for r in ok), "off_road_events": sum(int(r.get("off_road_events", 0)) for r in ok),
            "safe_stops": sum(r["reason"] == SAFE_STOP for r in ok),
            "success_mean": float(np.mean(per_run)), "success_std": float(np.std(per_run)),
            "score_ge_900": float(np.mean(scores >= 900)), "score_ge_860": float(np.mean(scores >= 860)),
            "score_mean": float(scores.mean()),
            "mean_abs_lateral_error": float(np.mean([r["mean_abs_lateral_error"] for r in ok])) if ok else math.nan,
            "driving_score": float(np.mean([r["driving_score"] for r in items])),
            "alarms_per_episode": float(np.mean([r.get("alarms", 0) for r in ok])) if ok else math.nan,
            "fallback_fraction": float(np.mean([r.get("fallback_fraction", 0.0) for r in ok])) if ok else math.nan,
            "mean_lap_steps": float(np.mean([r["steps"] for r in ok if r["lap_finished"]])) if any(r["lap_finished"] for r in ok) else math.nan,
        })
    return rows


def _write_summary(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """``summary.csv``: one row per episode record."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
    atomic_write_bytes(out_dir / "summary.csv", buffer.getvalue().encode())


def evaluate_closed_loop(config: EvalConfig, out_dir: Path, resume: bool = False, progress: bool = True) -> list[dict[str, Any]]:
    """Run every episode of ``config`` into ``out_dir``, write summary.csv + aggregates.json, return the aggregates.

    ``resume``: keep the episodes already in ``out_dir`` (without it, finding any is an error);
    the folder records the :data:`EvalConfig.EPISODE_FIELDS` it was started with, and a resume
    with another value for any of them is refused (:class:`nsacdrive.common.resume.SettingsChanged`),
    so every episode and ``aggregates.json`` share one set of settings. Workers, backend, address
    and inference mode may change (they give the same episodes)."""
    out_dir = Path(out_dir)
    inference = config.resolved_inference
    keys = config.keys()
    if resume:
        check_settings(out_dir, config, EvalConfig.EPISODE_FIELDS)
    folder = out_dir / "episodes"
    for leftovers in (out_dir, folder):  # temporary files of an evaluation that was killed
        remove_partial_files(leftovers)
    done = {k for k in keys if (folder / f"{k.episode_id}.json").exists()}
    if done and not resume:
        raise FileExistsError(f"{out_dir}: {len(done)} episodes already evaluated; pass --resume or choose another --out")
    record_settings(out_dir, config, EvalConfig.EPISODE_FIELDS)
    todo = [tuple(group) for group in batch_groups(keys, config.batch) if any(k not in done for k in group)]
    in_flight = 2 if inference == "process" else 1  # groups one task drives together
    tasks = [GroupsTask(tuple(groups), config.drive, inference, str(out_dir))
             for groups in _consecutive(todo, in_flight, lambda group: group[0].run)]
    results = run_tasks(_groups_worker, [(task,) for task in tasks], config.workers, backend=config.backend, address=config.address)
    try:
        with progress_bar(total=len(keys), initial=len(keys) - sum(len(g) for g in todo), unit="episode",
                          desc="closed loop", disable=not progress) as bar:
            for size in results:
                bar.update(size)
    finally:
        remove_partial_files(folder)  # a worker killed while writing an episode
    records = [json.loads((folder / f"{k.episode_id}.json").read_text()) for k in keys]
    _write_summary(out_dir, records)
    rows = aggregate(records, config.trials)
    atomic_write_json(out_dir / "aggregates.json", {
        "aggregates": rows, **asdict(config.drive), "seeds": list(config.seeds), "colour_presets": list(config.colour_presets),
        "corruptions": list(config.corruptions),
        "repeats": config.repeats, "trials": config.trials, "batch": config.batch, "inference": inference,
    })
    write_versions(out_dir)
    return rows
