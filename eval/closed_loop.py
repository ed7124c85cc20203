"""Closed-loop evaluation: trained controllers drive held-out tracks under colour presets.

Every episode is identified by (run, colour preset, track seed, repeat) and is the same
across models (paired design): same track, same colours, and a controller RNG seeded from
(track seed, repeat). Each runs on a plain env until terminated or truncated (reason logged),
writes a per-step log (``episodes/<id>.npz``: pose, speed, signed lateral and heading error,
progress, raw predicted mean, executed action, the privileged expert's action for the same
state, aleatoric and epistemic variance per action, and — for heads that attend over the frame
sequence (NSAC) — the newest query's attention on each of the T frames, NaN otherwise)
and a JSON record, atomically; ``--resume`` skips finished episodes. An exception or a NaN
action inside one episode is recorded as a failed episode with its reason and the evaluation
goes on.

Action post-processing (documented once): the executed action is the predictive mean clipped
to the action box; with ``throttle_cap=c`` the gas is additionally scaled by
min(1, c / σ_steer), σ_steer the predictive steering std, so the car slows down when it is
unsure where to steer.

Aggregates per (model, preset): success rate (lap finished) as mean ± std over evaluation runs
(``--runs``; each pools ``--trials`` episodes per track and preset), the
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from agents.expert import PurePursuitExpert
from agents.rollout import drive, termination_reason
from envs.car_racing import RENDERERS, make_car_racing
from envs.state import PrivilegedState
from nsacdrive.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from nsacdrive.backends import run_tasks

OFF_ROAD_PENALTY = 0.8
PLAYFIELD_PENALTY = 0.5


@dataclass(frozen=True)
class EpisodeKey:
    run: str
    colour_preset: str
    track_seed: int
    repeat: int

    @property
    def episode_id(self) -> str:
        return f"{Path(self.run).name}_{self.colour_preset}_seed{self.track_seed:06d}_r{self.repeat}"


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
              "expert_action", "aleatoric", "epistemic", "attention")


class LoggingDriver:
    """The controller's clipped mean, then the optional throttle cap; logs every prediction.

    At each step the privileged expert's action for the same state is logged too
    (``expert_action``), so traces can be compared with what the teacher would have done.
    """

    needs_pixels = True

    def __init__(self, agent: Any, cap: float | None, log: dict[str, list],
                 on_frame: Callable[[np.ndarray], None] | None = None) -> None:
        self.agent, self.cap, self.log, self.on_frame = agent, cap, log, on_frame
        self.expert = PurePursuitExpert()

    def reset(self) -> None:
        self.agent.reset()
        self.expert.reset()

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        if self.on_frame is not None:
            self.on_frame(observation)
        action = self.agent.act(observation, state)
        prediction = self.agent.last_prediction
        if not np.all(np.isfinite(prediction.mean.numpy())):
            raise FloatingPointError(f"non-finite action {prediction.mean.numpy().tolist()}")
        executed = throttle_cap(action, float(torch.sqrt(prediction.total[0, 0])), self.cap)
        self.log["raw_action"].append(prediction.mean[0].numpy())
        self.log["aleatoric"].append(prediction.aleatoric[0].numpy())
        self.log["epistemic"].append(prediction.epistemic[0].numpy())
        length = len(self.agent.offsets)
        attention = prediction.attention[0].numpy() if prediction.attention is not None else np.full(length, np.nan)
        self.log["attention"].append(attention)
        self.log["executed_action"].append(executed)
        self.log["expert_action"].append(self.expert.act(observation, state))
        return executed


def run_episode(key: EpisodeKey, max_steps: int, samples: int | None, cap: float | None,
                on_frame: Callable[[np.ndarray], None] | None = None,
                on_agent: Callable[[Any], None] | None = None,
                renderer: str = "fast") -> tuple[EpisodeRecord, dict[str, np.ndarray]]:
    """Drive one episode; never raises — failures become a failed record.

    ``on_frame`` (optional) receives every observation the controller sees, e.g. for a video;
    ``on_agent`` (optional) receives the :class:`eval.driver.ControllerAgent` before the first
    step, e.g. to hook its network and record internals of every prediction.
    """
    from eval.driver import ControllerAgent

    model = "?"
    try:
        agent = ControllerAgent(key.run, samples=samples)
        model = agent.train_config.model.model
        if on_agent is not None:
            on_agent(agent)
        torch.manual_seed(int(np.random.SeedSequence([key.track_seed, key.repeat]).generate_state(1)[0]))
        env = make_car_racing(colour_preset=key.colour_preset, max_episode_steps=max_steps, renderer=renderer)
        log: dict[str, list] = {name: [] for name in LOG_FIELDS}
        last, score = None, 0.0
        for step in drive(env, LoggingDriver(agent, cap, log, on_frame), key.track_seed):
            state = step.state
            log["pose"].append((state.pose.x, state.pose.y, state.pose.angle))
            log["speed"].append(state.pose.forward_speed)
            log["lateral_error"].append(state.lateral_error)
            log["heading_error"].append(state.heading_error)
            log["progress"].append(state.progress)
            last = step
            score += step.reward
        base = env.unwrapped
        completion = base.tile_visited_count / len(base.track)
        env.close()
    except Exception as exc:  # an env or controller fault fails this episode only
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        record = EpisodeRecord(key.run, model, key.colour_preset, key.track_seed, key.repeat, failed=True, reason=reason)
        return record, {"traceback": np.array(traceback.format_exc())}
    arrays = {name: np.asarray(values, dtype=np.float32) for name, values in log.items()}
    lateral = np.abs(arrays["lateral_error"])
    off_road = lateral > base.geometry.half_width
    raw = arrays["raw_action"]
    record = EpisodeRecord(
        key.run, model, key.colour_preset, key.track_seed, key.repeat, failed=False,
        reason=termination_reason(last.terminated, last.truncated, last.info), steps=len(lateral), score=float(score),
        lap_finished=bool(last.info.get("lap_finished", False)), route_completion=float(completion),
        mean_abs_lateral_error=float(lateral.mean()), max_abs_lateral_error=float(lateral.max()),
        off_road_fraction=float(off_road.mean()), off_road_events=int(np.count_nonzero(off_road[1:] & ~off_road[:-1]) + off_road[0]),
        mean_speed=float(arrays["speed"].mean()),
        mean_steer_std=float(np.sqrt(arrays["aleatoric"][:, 0] + arrays["epistemic"][:, 0]).mean()),
        clip_rate=float(np.mean(np.any(np.abs(raw - np.clip(raw, [-1, 0, 0], [1, 1, 1])) > 0, axis=1))) if len(raw) else 0.0,
    )
    return record, arrays


def _episode_worker(key: EpisodeKey, out_dir: str, max_steps: int, samples: int | None, cap: float | None,
                    renderer: str) -> dict[str, Any]:
    record, arrays = run_episode(key, max_steps, samples, cap, renderer=renderer)
    folder = Path(out_dir) / "episodes"
    with atomic_path(folder / f"{key.episode_id}.npz") as tmp:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
    data = {**asdict(record), "driving_score": record.driving_score, "episode_id": key.episode_id}
    atomic_write_json(folder / f"{key.episode_id}.json", data)
    return data


def aggregate(records: list[dict[str, Any]], trials: int = 1) -> list[dict[str, Any]]:
    """Per (model, run, preset): success mean ± std over evaluation runs and the other aggregates.

    Episode ``repeat`` k belongs to evaluation run k // ``trials`` (each run pools its trials)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["model"], Path(r["run"]).name, r["colour_preset"]), []).append(r)
    rows = []
    for (model, run, preset), items in sorted(groups.items()):
        runs = sorted({r["repeat"] // trials for r in items})
        per_run = [np.mean([r["lap_finished"] for r in items if r["repeat"] // trials == k]) for k in runs]
        scores = np.array([r["score"] for r in items])
        ok = [r for r in items if not r["failed"]]
        rows.append({
            "model": model, "run": run, "colour_preset": preset, "episodes": len(items), "failed": len(items) - len(ok),
            "success_mean": float(np.mean(per_run)), "success_std": float(np.std(per_run)),
            "score_ge_900": float(np.mean(scores >= 900)), "score_ge_860": float(np.mean(scores >= 860)),
            "score_mean": float(scores.mean()),
            "mean_abs_lateral_error": float(np.mean([r["mean_abs_lateral_error"] for r in ok])) if ok else math.nan,
            "driving_score": float(np.mean([r["driving_score"] for r in items])),
        })
    return rows


def evaluate_closed_loop(runs: list[Path], seeds: list[int], presets: list[str], repeats: int, out_dir: Path,
                         max_steps: int = 1000, workers: int = 1, samples: int | None = None,
                         cap: float | None = None, resume: bool = False, progress: bool = True,
                         backend: str = "process", address: str | None = None, trials: int = 1,
                         renderer: str = "fast") -> list[dict[str, Any]]:
    """Run every (run, preset, seed, repeat) episode, write summary.csv + aggregates.json, return aggregates.

    ``repeats`` evaluation runs of ``trials`` episodes per (seed, preset) each: episode repeat
    k = run·trials + trial seeds the controller RNG; success is mean ± std over the runs.

    ``renderer``: how frames are drawn (``fast``, the default, or gymnasium's ``stock`` code).
    ``backend``/``address`` choose where episodes run (``nsacdrive.backends.run_tasks``: local processes
    or a Ray cluster); every backend gives the same episodes for the same seeds.
    """
    if renderer not in RENDERERS:
        raise ValueError(f"--renderer: expected one of {', '.join(RENDERERS)}, got {renderer!r}")
    if repeats < 1 or trials < 1:
        raise ValueError(f"--runs and --trials must be >= 1, got {repeats} and {trials}")
    keys = [EpisodeKey(str(run), preset, seed, repeat) for run in runs for preset in presets for seed in seeds
            for repeat in range(repeats * trials)]
    folder = out_dir / "episodes"
    done = {k for k in keys if (folder / f"{k.episode_id}.json").exists()}
    if done and not resume:
        raise FileExistsError(f"{out_dir}: {len(done)} episodes already evaluated; pass --resume or choose another --out")
    todo = [k for k in keys if k not in done]
    args = [(k, str(out_dir), max_steps, samples, cap, renderer) for k in todo]
    results = run_tasks(_episode_worker, args, workers, backend=backend, address=address)
    with tqdm(total=len(keys), initial=len(done), unit="episode", desc="closed loop", disable=not progress) as bar:
        for _ in results:
            bar.update(1)
    records = [json.loads((folder / f"{k.episode_id}.json").read_text()) for k in keys]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
    atomic_write_bytes(out_dir / "summary.csv", buffer.getvalue().encode())
    rows = aggregate(records, trials)
    atomic_write_json(out_dir / "aggregates.json", {"aggregates": rows, "throttle_cap": cap, "max_steps": max_steps,
                                                     "samples": samples, "seeds": seeds, "colour_presets": presets,
                                                     "repeats": repeats, "trials": trials, "renderer": renderer})
    return rows
