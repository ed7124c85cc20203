"""Run any Agent over seeds × colour presets and write one lossless episode per run.

Each episode is produced by one worker process from (agent spec, track seed, preset, noise),
all of which are in its sidecar, so any episode can be regenerated exactly. The main process
keeps ``manifest.json`` current after every finished episode; a killed run loses at most the
episodes in flight, and ``resume=True`` skips every episode whose files are already complete.
"""

from __future__ import annotations

import hashlib
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from tqdm import tqdm

from agents.registry import make_agent
from agents.rollout import Step, drive, termination_reason
from data_collection.episode import EpisodeFileError, EpisodePaths, read_sidecar, write_episode
from data_collection.manifest import write_manifest
from envs.car_racing import ENV_ID, MAX_EPISODE_STEPS, RENDERERS, make_car_racing
from envs.colours import validate_preset
from envs.observation import PREPROCESS_VERSION
from envs.state import STATE_FIELDS
from nsacdrive.atomic import remove_partial_files
from nsacdrive.backends import run_tasks

#: The fast renderer matches stock frames to < 1/255 mean absolute difference (bench/renderer.py)
#: at several times the throughput, so recordings use it unless told otherwise.
DEFAULT_RENDERER = "fast"


@dataclass(frozen=True)
class NoiseConfig:
    """Gaussian action noise on the EXECUTED action (the expert's label is recorded untouched).

    See :func:`agents.rollout.apply_action_noise`. ``seed`` salts the noise stream (combined
    with the track seed), so noisy episodes are reproducible too.
    """

    sigma: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sigma < 0:
            raise ValueError(f"--noise must be >= 0, got {self.sigma}")


@dataclass(frozen=True)
class MixingConfig:
    """DAgger data: the recorded agent labels every step while ``learner`` (an agent spec, e.g.
    ``controller:runs/nsac``) drives with probability 1 − ``beta`` per step (seeded like the noise).
    ``source`` names the data in sidecars and episode ids, e.g. ``dagger-round-2``."""

    learner: str
    beta: float
    source: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {self.beta}")
        if not self.source or any(c in self.source for c in "/\\:"):
            raise ValueError(f"mixing source must be a plain name such as 'dagger-round-1', got {self.source!r}")


@dataclass(frozen=True)
class EpisodeJob:
    """Everything that determines one recorded episode."""

    agent: str
    track_seed: int
    colour_preset: str
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    max_steps: int = MAX_EPISODE_STEPS
    renderer: str = DEFAULT_RENDERER
    mixing: MixingConfig | None = None

    @property
    def episode_id(self) -> str:
        noise = f"_noise{self.noise.sigma:g}-{self.noise.seed}" if self.noise.sigma > 0 else ""
        mixing = f"_{self.mixing.source}" if self.mixing is not None else ""
        agent = self.agent.replace(":", "-").replace("/", "-")
        return f"{agent}_{self.colour_preset}_seed{self.track_seed:06d}{noise}{mixing}"


def episode_from_steps(
    steps: list[Step],
    env: gymnasium.Env,
    *,
    source: str,
    agent_config: dict[str, Any],
    agent_spec: str,
    track_seed: int,
    colour_preset: str,
    renderer: str,
    max_steps: int,
    noise: NoiseConfig = NoiseConfig(),
    mixing: MixingConfig | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The standard episode arrays and sidecar metadata for ``steps`` driven in ``env`` (which may be closed)."""
    if not steps:
        raise ValueError("an episode needs at least one step")
    states = [steps[0].state] + [s.next_state for s in steps]
    last = steps[-1]
    arrays = {
        "observations": np.stack([steps[0].observation] + [s.next_observation for s in steps]).astype(np.uint8),
        "actions": np.stack([s.executed for s in steps]).astype(np.float32),
        "expert_actions": np.stack([s.label for s in steps]).astype(np.float32),
        "rewards": np.array([s.reward for s in steps], dtype=np.float32),
        "terminations": np.array([s.terminated for s in steps], dtype=bool),
        "truncations": np.array([s.truncated for s in steps], dtype=bool),
        "pose": np.array([(st.pose.x, st.pose.y, st.pose.angle) for st in states], dtype=np.float32),
        "speed": np.array([st.pose.forward_speed for st in states], dtype=np.float32),
        "lateral_error": np.array([st.lateral_error for st in states], dtype=np.float32),
        "heading_error": np.array([st.heading_error for st in states], dtype=np.float32),
        "progress": np.array([st.progress for st in states], dtype=np.float32),
        "state": np.stack([st.as_vector() for st in states]).astype(np.float32),
    }
    base = env.unwrapped
    metadata = {
        "env_id": ENV_ID,
        "base_env": "CarRacing-v3",
        "gymnasium_version": gymnasium.__version__,
        "renderer": renderer,
        "track_seed": track_seed,
        "n_tiles": len(base.track),
        "colour_preset": colour_preset,
        "colour_scheme": base.colour_scheme.to_dict(),
        "source": source,
        "agent": agent_config,
        "agent_spec": agent_spec,
        "noise": asdict(noise),
        "mixing": asdict(mixing) if mixing is not None else None,
        "max_steps": max_steps,
        "total_reward": float(np.sum(arrays["rewards"], dtype=np.float64)),
        "lap_finished": bool(last.info.get("lap_finished", False)),
        "termination_reason": termination_reason(last.terminated, last.truncated, last.info),
        "state_fields": list(STATE_FIELDS),
        "preprocess": PREPROCESS_VERSION,
        "python": platform.python_version(),
    }
    return arrays, metadata


def run_episode(job: EpisodeJob) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Drive one episode and return its arrays and sidecar metadata (nothing written)."""
    agent = make_agent(job.agent)
    learner = make_agent(job.mixing.learner) if job.mixing is not None else None
    beta = job.mixing.beta if job.mixing is not None else 1.0
    env = make_car_racing(colour_preset=job.colour_preset, max_episode_steps=job.max_steps, renderer=job.renderer)
    rng = np.random.default_rng([job.noise.seed, job.track_seed])
    steps = list(drive(env, agent, job.track_seed, job.noise.sigma, rng, learner, beta))
    env.close()
    return episode_from_steps(
        steps, env,
        source=job.mixing.source if job.mixing is not None else agent.source,
        agent_config=agent.config(), agent_spec=job.agent, track_seed=job.track_seed,
        colour_preset=job.colour_preset, renderer=job.renderer, max_steps=job.max_steps,
        noise=job.noise, mixing=job.mixing,
    )


def record_episode(job: EpisodeJob, out_dir: str) -> dict[str, Any]:
    """Worker entry point: drive, then write the episode atomically; returns the sidecar."""
    arrays, metadata = run_episode(job)
    return write_episode(Path(out_dir), job.episode_id, arrays, metadata)


def episode_is_complete(out_dir: Path, job: EpisodeJob) -> bool:
    """True when the sidecar exists, parses, and pins the .npz beside it (size and sha256)."""
    paths = EpisodePaths.for_id(out_dir, job.episode_id)
    try:
        sidecar = read_sidecar(paths.sidecar)
        payload = paths.data.read_bytes()
    except (EpisodeFileError, OSError):
        return False
    return len(payload) == sidecar["file_size"] and hashlib.sha256(payload).hexdigest() == sidecar["sha256"]


@dataclass
class CollectionSummary:
    written: int
    skipped: int
    steps: int
    seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


def collect(
    agent: str,
    seeds: list[int],
    out_dir: str | Path,
    colour_presets: list[str] = ["default"],
    noise: NoiseConfig = NoiseConfig(),
    workers: int = 1,
    resume: bool = False,
    max_steps: int = MAX_EPISODE_STEPS,
    progress: bool = True,
    renderer: str = DEFAULT_RENDERER,
    mixing: MixingConfig | None = None,
) -> CollectionSummary:
    """Record ``agent`` on every (seed, preset); parallel workers, one progress bar.

    ``mixing``: record DAgger data (the agent labels, a learner drives part of the time)."""
    out = Path(out_dir)
    if not colour_presets:
        raise ValueError("--colour-preset: give at least one colour preset")
    if len(set(colour_presets)) != len(colour_presets):
        raise ValueError(f"--colour-preset: presets listed twice in {colour_presets}")
    if renderer not in RENDERERS:
        raise ValueError(f"--renderer: expected one of {', '.join(RENDERERS)}, got {renderer!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError("--seeds: seeds listed twice")
    for preset in colour_presets:
        validate_preset(preset)
    make_agent(agent)  # fail fast on a bad agent spec, before any worker starts
    if mixing is not None:
        make_agent(mixing.learner)
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    jobs = [EpisodeJob(agent, seed, preset, noise, max_steps, renderer, mixing) for preset in colour_presets for seed in seeds]
    out.mkdir(parents=True, exist_ok=True)
    remove_partial_files(out)
    existing = [job for job in jobs if episode_is_complete(out, job)]
    if existing and not resume:
        raise FileExistsError(
            f"{out}: {len(existing)} of these episodes already exist (e.g. {existing[0].episode_id}); "
            "pass --resume to skip them or choose another --out"
        )
    todo = [job for job in jobs if job not in existing]
    start = time.perf_counter()
    steps = 0
    with tqdm(total=len(jobs), initial=len(existing), unit="episode", desc="collect", disable=not progress) as bar:
        for sidecar in run_tasks(record_episode, [(job, str(out)) for job in todo], workers):
            steps += sidecar["n_steps"]
            write_manifest(out)
            bar.update(1)
            bar.set_postfix(steps_per_s=f"{steps / (time.perf_counter() - start):.0f}")
    write_manifest(out)
    return CollectionSummary(written=len(todo), skipped=len(existing), steps=steps, seconds=time.perf_counter() - start)
