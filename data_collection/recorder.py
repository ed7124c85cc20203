"""Run any Agent over seeds × colour presets and write one lossless episode per run.

Two built-in envs (``ENVS``): ``carracing`` (the 96×96 top-down frame) and ``udacity-style``
(:mod:`nsacdrive.envs.udacity_style`: 160×320 front-camera frames, all three cameras recorded), and
any env registered with :func:`nsacdrive.envs.observation_kinds.register_observation_kind`. Two output
layouts (``LAYOUTS``): ``episodes`` (the standard lossless format) and, for ``udacity-style``,
``udacity`` (:mod:`nsacdrive.data_collection.udacity_layout`: JPEGs + ``driving_log.csv``).

Each episode is produced by one worker process from (agent spec, track seed, preset, noise),
all of which are in its sidecar, so any episode can be regenerated exactly. The main process
keeps ``manifest.json`` current after every finished episode; a killed run loses at most the
episodes in flight, and ``resume=True`` skips every episode whose files are already complete.
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import numpy as np

from nsacdrive.agents.base import Agent, seed_agent
from nsacdrive.agents.registry import AGENT_KINDS, AgentKinds
from nsacdrive.agents.rollout import Step, drive, termination_reason
from nsacdrive.common.atomic import remove_partial_files
from nsacdrive.common.backends import run_tasks
from nsacdrive.common.config_checks import POSITIVE, WIDTH, Range, check_distinct, check_fields
from nsacdrive.common.progress import progress_bar
from nsacdrive.common.resume import check_settings, record_settings
from nsacdrive.common.seeds import derive_seed
from nsacdrive.data_collection.episode import CAMERA_LABEL_ARRAYS, EpisodeFileError, EpisodePaths, read_sidecar, write_episode
from nsacdrive.data_collection.manifest import write_manifest
from nsacdrive.data_collection.udacity_layout import (
    prepare_udacity_folder,
    remove_udacity_leftovers,
    udacity_episode_is_complete,
    write_driving_log,
    write_udacity_episode,
)
from nsacdrive.envs.car_racing import ENV_ID, MAX_EPISODE_STEPS, RENDERERS
from nsacdrive.envs.colours import validate_preset
from nsacdrive.envs.front_camera import HORIZONTAL_FOV, CameraConfig
from nsacdrive.envs.observation_kinds import DEFAULT_CAMERA_FOV, RECORDING_ENVS, make_kind_env, observation_kind
from nsacdrive.envs.state import STATE_FIELDS, PrivilegedState, shifted_sideways
from nsacdrive.envs.udacity_style import CAMERAS, SIDE_CAMERAS, SideCameraLog, UdacityStyleCarRacing, make_udacity_style
from nsacdrive.envs.udacity_style import ENV_ID as UDACITY_STYLE_ENV_ID
from nsacdrive.envs.udacity_style import RENDERER as FRONT_CAMERA_RENDERER

#: The fast renderer matches stock frames to < 1/255 mean absolute difference (bench/renderer.py)
#: at several times the throughput, so recordings use it unless told otherwise.
DEFAULT_RENDERER = "fast"
#: the side cameras' lateral offset unless told otherwise: the front camera's (the Udacity simulator's)
DEFAULT_SIDE_OFFSET = CameraConfig().side_offset
#: the env names ``CollectConfig.env`` takes, registered ones included (a live view of
#: :data:`nsacdrive.envs.observation_kinds.RECORDING_ENVS`)
ENVS = RECORDING_ENVS.keys()
LAYOUTS = ("episodes", "udacity")


def recording_renderer(env: str, layout: str, renderer: str | None, where: str,
                       flags: Mapping[str, str] | None = None) -> str:
    """Check that ``env``, ``layout`` and ``renderer`` go together; returns the renderer the frames are
    drawn with: the front camera's own for ``udacity-style``, a CarRacing one (None: ``fast``) otherwise.

    :param where: the config named in errors, e.g. ``collect config``
    :param flags: the command-line flag of ``env``, ``layout`` and ``renderer``: errors then name the
        settings as typed (``--layout udacity needs --env udacity-style``), not as fields of ``where``
    """
    prefix = f"{where} " if flags is None else ""

    def subject(name: str) -> str:
        return prefix + (name if flags is None else flags[name])

    def setting(name: str, value: str) -> str:
        return f"{name} {value!r}" if flags is None else f"{flags[name]} {value}"

    if env not in ENVS:
        raise ValueError(f"{subject('env')}: expected one of {', '.join(ENVS)}, got {env!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"{subject('layout')}: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "udacity" and env != "udacity-style":
        raise ValueError(f"{prefix}{setting('layout', layout)} needs {setting('env', 'udacity-style')} "
                         "(the Udacity layout holds 320×160 camera frames)")
    if env == "udacity-style":
        if renderer not in (None, FRONT_CAMERA_RENDERER):
            raise ValueError(f"{subject('renderer')}: the udacity-style env draws its own front camera; "
                             f"{setting('renderer', renderer)} is for {setting('env', 'carracing')}")
        return FRONT_CAMERA_RENDERER
    renderer = DEFAULT_RENDERER if renderer is None else renderer
    if renderer not in RENDERERS:
        raise ValueError(f"{subject('renderer')}: expected one of {', '.join(RENDERERS)}, got {renderer!r}")
    return renderer


def check_camera_fov(env: str, layout: str, camera_fov: float, where: str) -> None:
    """A non-default field of view needs the front cameras (``udacity-style``) and a layout that
    records it (``episodes``); ``where`` names the config in the error."""
    if camera_fov == DEFAULT_CAMERA_FOV:
        return
    if env != "udacity-style":
        raise ValueError(f"{where} camera_fov applies to env 'udacity-style' (its front cameras), got env {env!r}")
    if layout != "episodes":
        raise ValueError(f"{where} camera_fov needs layout 'episodes' (the {layout!r} layout does not record it), got layout {layout!r}")


def make_recording_env(env: str, colour_preset: str, max_steps: int, renderer: str,
                       render_mode: str | None = None, camera: CameraConfig = CameraConfig()) -> gymnasium.Env:
    """The env a recording drives: ``udacity-style`` records its side cameras too (in a
    :class:`SideCameraLog`, ``camera.side_offset`` units to either side, all three with ``camera``'s
    field of view); ``carracing`` and registered envs draw their frames with ``renderer``.
    ``render_mode``: gymnasium's."""
    if env == "udacity-style":
        return SideCameraLog(make_udacity_style(colour_preset=colour_preset, max_episode_steps=max_steps,
                                                side_cameras=True, render_mode=render_mode, camera=camera))
    return make_kind_env(RECORDING_ENVS[env], colour_preset, max_steps, renderer, render_mode)


def prepare_folder(out: Path, layout: str) -> None:
    """Create ``out`` for ``layout`` and delete leftovers of interrupted atomic writes."""
    out.mkdir(parents=True, exist_ok=True)
    if layout == "udacity":
        prepare_udacity_folder(out)
    else:
        remove_partial_files(out)


def remove_leftovers(out: Path, layout: str) -> None:
    """Delete the temporary files of atomic writes that never finished in a ``layout`` folder."""
    if layout == "udacity":
        remove_udacity_leftovers(out)
    else:
        remove_partial_files(out)


def write_layout_episode(out: Path, episode_id: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any],
                         layout: str) -> dict[str, Any]:
    """Write one episode atomically in ``layout``; returns its sidecar."""
    if layout == "udacity":
        return write_udacity_episode(out, episode_id, arrays, metadata)
    return write_episode(out, episode_id, arrays, metadata)


def write_index(out: Path, layout: str) -> None:
    """Rebuild the folder's index from its complete episodes: ``driving_log.csv`` or ``manifest.json``."""
    if layout == "udacity":
        write_driving_log(out)
    else:
        write_manifest(out)


#: the longest recorded episode: its frames are held in memory until it is written (CarRacing's horizon is 1,000)
MAX_STEPS = Range(1, 100_000)
#: the numbers CollectConfig's numeric fields may take
COLLECT_RANGES = {"max_steps": MAX_STEPS, "workers": WIDTH, "side_offset": POSITIVE, "camera_fov": HORIZONTAL_FOV}
#: the largest action-noise std: actions live in [-1, 1], so more is noise, not a demonstration
MAX_NOISE = 2.0
#: the numbers NoiseConfig's fields may take: the std, and a salt that fits a signed 64-bit integer
NOISE_RANGES = {"sigma": Range(0, MAX_NOISE), "seed": Range(0, 2**63, high_open=True)}


@dataclass(frozen=True)
class NoiseConfig:
    """Gaussian action noise on the EXECUTED action (the expert's label is recorded untouched).

    See :func:`nsacdrive.agents.rollout.apply_action_noise`. ``seed`` salts the noise stream (combined
    with the track seed), so noisy episodes are reproducible too.
    """

    sigma: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:  # the messages name the command's options: a user sets these there
        sigma, seed = NOISE_RANGES["sigma"], NOISE_RANGES["seed"]
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not sigma.contains(self.sigma):
            raise ValueError(f"--noise must be a number {sigma} (the std of the noise on actions in [-1, 1]), got {self.sigma}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not seed.contains(self.seed):
            raise ValueError(f"--noise-seed must be an integer in [0, 2**63), got {self.seed}")  # the range, as a reader writes it


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
    env: str = "carracing"
    side_offset: float = DEFAULT_SIDE_OFFSET  # ``udacity-style``: the side cameras' lateral offset (world units)
    camera_fov: float = DEFAULT_CAMERA_FOV  # ``udacity-style``: every camera's horizontal field of view (degrees)
    #: how to build the agents the specs name (not part of the episode: the specs are)
    agent_kinds: AgentKinds = field(default=AGENT_KINDS, compare=False, repr=False)

    @property
    def episode_id(self) -> str:
        noise = f"_noise{self.noise.sigma:g}-{self.noise.seed}" if self.noise.sigma > 0 else ""
        mixing = f"_{self.mixing.source}" if self.mixing is not None else ""
        env = f"_{self.env}" if self.env != "carracing" else ""
        env += f"-side{self.side_offset:g}" if self.side_offset != DEFAULT_SIDE_OFFSET else ""
        env += f"-fov{self.camera_fov:g}" if self.camera_fov != DEFAULT_CAMERA_FOV else ""
        agent = self.agent.replace(":", "-").replace("/", "-")
        return f"{agent}_{self.colour_preset}_seed{self.track_seed:06d}{noise}{mixing}{env}"

    def make_env(self) -> gymnasium.Env:
        """The env this job drives (a ``udacity-style`` env records its side cameras too)."""
        return make_recording_env(self.env, self.colour_preset, self.max_steps, self.renderer, camera=self.camera)

    @property
    def camera(self) -> CameraConfig:
        """``udacity-style``: the front cameras this job records with."""
        return CameraConfig(side_offset=self.side_offset, horizontal_fov=self.camera_fov)


def episode_from_steps(
    steps: list[Step],
    env: gymnasium.Env,
    *,
    frame_kind: str,
    source: str,
    agent_config: dict[str, Any],
    agent_spec: str,
    track_seed: int,
    colour_preset: str,
    renderer: str,
    max_steps: int,
    noise: NoiseConfig = NoiseConfig(),
    mixing: MixingConfig | None = None,
    side_frames: dict[str, list[np.ndarray]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The standard episode arrays and sidecar metadata for ``steps`` driven in ``env`` (which may be closed),
    whose frames are of observation kind ``frame_kind`` (the recorder env's, :data:`RECORDING_ENVS`).

    ``side_frames`` (camera name → T+1 frames, e.g. :attr:`nsacdrive.envs.udacity_style.SideCameraLog.frames`)
    become the optional ``<name>_observations`` arrays."""
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
    for name, frames in (side_frames or {}).items():
        arrays[f"{name}_observations"] = np.stack(frames).astype(np.uint8)
    base = env.unwrapped
    front_camera = isinstance(base, UdacityStyleCarRacing)
    metadata = {
        "env_id": UDACITY_STYLE_ENV_ID if front_camera else ENV_ID,
        "frame_kind": frame_kind,
        "cameras": ["center", *(side_frames or {})],
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
        "preprocess": observation_kind(frame_kind).version,
        "python": platform.python_version(),
    }
    if front_camera:
        metadata["camera_fov"] = base.camera.config.horizontal_fov
    return arrays, metadata


def run_episode(job: EpisodeJob) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Drive one episode and return its arrays and sidecar metadata (nothing written)."""
    agent = job.agent_kinds.make(job.agent)
    learner = job.agent_kinds.make(job.mixing.learner) if job.mixing is not None else None
    beta = job.mixing.beta if job.mixing is not None else 1.0
    env = job.make_env()
    episode_seed = derive_seed(job.noise.seed, job.track_seed)
    for actor in (agent, learner):
        if actor is not None:
            seed_agent(actor, episode_seed)
    rng = np.random.default_rng([job.noise.seed, job.track_seed])
    steps = list(drive(env, agent, job.track_seed, job.noise.sigma, rng, learner, beta))
    env.close()
    side_frames = env.frames if isinstance(env, SideCameraLog) else None
    arrays, metadata = episode_from_steps(
        steps, env, frame_kind=RECORDING_ENVS[job.env],
        source=job.mixing.source if job.mixing is not None else agent.source,
        agent_config=agent.config(), agent_spec=job.agent, track_seed=job.track_seed,
        colour_preset=job.colour_preset, renderer=job.renderer, max_steps=job.max_steps,
        noise=job.noise, mixing=job.mixing, side_frames=side_frames,
    )
    if side_frames is not None:
        metadata["side_offset"] = job.side_offset
        labeller = state_labeller(agent)
        if labeller is not None:
            arrays |= side_camera_labels(labeller, steps, job.side_offset)
    return arrays, metadata


def state_labeller(agent: Agent) -> Callable[[PrivilegedState], np.ndarray] | None:
    """How ``agent`` labels a state the car never drove (its ``label_state``: the experts and PPO
    state policies have one), or None when it cannot: it needs pixels or has no such method."""
    label_state = getattr(agent, "label_state", None)
    return label_state if callable(label_state) and not agent.needs_pixels else None


def side_camera_labels(label: Callable[[PrivilegedState], np.ndarray], steps: list[Step],
                       side_offset: float) -> dict[str, np.ndarray]:
    """``<camera>_expert_actions``: the label of every step's state with the car moved onto each
    side camera's position — the exact recovery label for that camera's frames."""
    return {
        CAMERA_LABEL_ARRAYS[name]: np.stack([
            label(shifted_sideways(step.state, CAMERAS[name] * side_offset)) for step in steps
        ]).astype(np.float32)
        for name in SIDE_CAMERAS
    }


def record_episode(job: EpisodeJob, out_dir: str, layout: str = "episodes") -> dict[str, Any]:
    """Worker entry point: drive, then write the episode atomically in ``layout``; returns the sidecar."""
    arrays, metadata = run_episode(job)
    return write_layout_episode(Path(out_dir), job.episode_id, arrays, metadata, layout)


def episode_is_complete(out_dir: Path, job: EpisodeJob, layout: str = "episodes") -> bool:
    """True when the sidecar exists, parses, and pins the .npz beside it (size and sha256)
    (``udacity`` layout: pins the episode's rows, see :mod:`nsacdrive.data_collection.udacity_layout`)."""
    if layout == "udacity":
        return udacity_episode_is_complete(out_dir, job.episode_id)
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


@dataclass(frozen=True)
class CollectConfig:
    """A recording job: which episodes (agent × seeds × colour presets, with noise) and how each is recorded.

    :param agent: the agent spec that drives and labels (``expert``, ``ppo:DIR``, ``controller:RUN`` …)
    :param seeds: track seeds
    :param colour_presets: colour presets, each recorded on every seed
    :param noise: Gaussian noise on the executed action (labels stay clean)
    :param max_steps: episode horizon
    :param renderer: the CarRacing frame renderer (None: ``fast``); the ``udacity-style`` env draws its own camera
    :param mixing: DAgger data: the agent labels while a learner drives part of the time
    :param env: one of :data:`ENVS` (see the module docstring)
    :param layout: one of :data:`LAYOUTS` (``udacity`` needs ``env="udacity-style"``)
    :param workers: worker processes
    :param side_offset: ``udacity-style``: how far (world units) the side cameras sit to either side;
        with a teacher that labels any state each side camera gets its own labels (:func:`side_camera_labels`)
    :param camera_fov: ``udacity-style``: the cameras' horizontal field of view (degrees; a
        controller trained on these frames drives with the same camera, ``ModelConfig.camera_fov``)
    """

    agent: str
    seeds: tuple[int, ...]
    colour_presets: tuple[str, ...] = ("default",)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    max_steps: int = MAX_EPISODE_STEPS
    renderer: str | None = None
    mixing: MixingConfig | None = None
    env: str = "carracing"
    layout: str = "episodes"
    workers: int = 1
    side_offset: float = DEFAULT_SIDE_OFFSET
    camera_fov: float = DEFAULT_CAMERA_FOV

    #: the settings every episode of one folder shares: they shape an episode without naming it
    #: (agent, seed, preset, noise and env are part of each episode id)
    FOLDER_FIELDS: ClassVar[tuple[str, ...]] = ("max_steps", "renderer", "mixing", "env", "layout")

    def __post_init__(self) -> None:
        check_fields(self, "collect config", COLLECT_RANGES)
        if self.side_offset != DEFAULT_SIDE_OFFSET and self.env != "udacity-style":
            raise ValueError(f"collect config side_offset applies to env 'udacity-style' (its side cameras), got env {self.env!r}")
        check_camera_fov(self.env, self.layout, self.camera_fov, "collect config")
        object.__setattr__(self, "renderer", recording_renderer(self.env, self.layout, self.renderer, "collect config"))
        if not self.colour_presets:
            raise ValueError("collect config colour_presets: give at least one colour preset")
        check_distinct("collect config", "colour_presets", self.colour_presets)
        check_distinct("collect config", "seeds", self.seeds)
        for preset in self.colour_presets:
            validate_preset(preset)

    def jobs(self, agent_kinds: AgentKinds = AGENT_KINDS) -> list[EpisodeJob]:
        """One job per (preset, seed), preset-major; ``agent_kinds`` builds the agents in the workers."""
        return [EpisodeJob(self.agent, seed, preset, self.noise, self.max_steps, self.renderer, self.mixing, self.env,
                           side_offset=self.side_offset, camera_fov=self.camera_fov, agent_kinds=agent_kinds)
                for preset in self.colour_presets for seed in self.seeds]


def collect(config: CollectConfig, out_dir: str | Path, resume: bool = False, progress: bool = True,
            agent_kinds: AgentKinds = AGENT_KINDS) -> CollectionSummary:
    """Record every episode of ``config`` into ``out_dir``; parallel workers, one progress bar.

    ``resume``: skip the episodes already complete (without it, finding any is an error). A
    folder holds episodes recorded one way: its :data:`CollectConfig.FOLDER_FIELDS` are recorded
    when it is first written and another value for any of them is refused
    (:class:`nsacdrive.common.resume.SettingsChanged`); seeds, presets, noise and the agent may
    differ from one call to the next.
    ``agent_kinds``: the kinds the agent and the learner may name
    (:data:`nsacdrive.agents.registry.AGENT_KINDS` by default; a layer above passes its own, e.g.
    with ``controller:RUN``); it travels with every job to the workers."""
    out = Path(out_dir)
    agent_kinds.make(config.agent)  # fail fast on a bad agent spec, before any worker starts
    if config.mixing is not None:
        agent_kinds.make(config.mixing.learner)
    jobs = config.jobs(agent_kinds)
    check_settings(out, config, CollectConfig.FOLDER_FIELDS)
    prepare_folder(out, config.layout)
    existing = [job for job in jobs if episode_is_complete(out, job, config.layout)]
    if existing and not resume:
        raise FileExistsError(
            f"{out}: {len(existing)} of these episodes already exist (e.g. {existing[0].episode_id}); "
            "pass --resume to skip them or choose another --out"
        )
    record_settings(out, config, CollectConfig.FOLDER_FIELDS)
    todo = [job for job in jobs if job not in existing]
    start = time.perf_counter()
    steps = 0
    try:
        with progress_bar(total=len(jobs), initial=len(existing), unit="episode", desc="collect", disable=not progress) as bar:
            for sidecar in run_tasks(record_episode, [(job, str(out), config.layout) for job in todo], config.workers):
                steps += sidecar["n_steps"]
                write_index(out, config.layout)
                bar.update(1)
                bar.set_postfix(steps_per_s=f"{steps / (time.perf_counter() - start):.0f}")
    finally:
        remove_leftovers(out, config.layout)  # a worker killed while writing an episode
    write_index(out, config.layout)
    return CollectionSummary(written=len(todo), skipped=len(existing), steps=steps, seconds=time.perf_counter() - start)
