"""Shared helpers for the data-collection tests (a plain module, imported by the test files).

* :func:`synthetic_arrays` / :func:`write_synthetic` build episodes without running the env:
  every frame carries a per-step marker in its top-left pixel (row 0 is kept by the HUD crop),
  so a test can tell exactly which frames a dataset returned.
* :func:`replay_episode` re-drives a recorded episode's executed actions in a fresh env and
  compares everything the recorder stored.
* :func:`normalize` flattens typer/rich error boxes so messages can be searched.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Never open a window or an audio device, even if this module is imported before conftest ran.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import numpy as np  # noqa: E402

from nsacdrive.data_collection.episode import encode_episode, write_episode  # noqa: E402
from nsacdrive.envs.colours import resolve_colour_scheme  # noqa: E402
from nsacdrive.envs.state import STATE_FIELDS  # noqa: E402

STATE_DIM = len(STATE_FIELDS)


def frame_marker(frames: np.ndarray) -> np.ndarray:
    """Decode the step marker of raw uint8 frames (..., 96, 96, 3)."""
    frames = np.asarray(frames)
    return frames[..., 0, 0, 0].astype(np.int64) + 256 * frames[..., 0, 0, 1].astype(np.int64)


def preprocessed_marker(frames: np.ndarray) -> np.ndarray:
    """Decode the step marker of network-layout frames (..., 3, 84, 96): a dataset's uint8 frames
    or preprocessed floats in [0, 1]."""
    frames = np.asarray(frames)
    levels = frames.astype(np.int64) if frames.dtype == np.uint8 else np.rint(frames * 255).astype(np.int64)
    return levels[..., 0, 0, 0] + 256 * levels[..., 1, 0, 0]


def synthetic_arrays(n_steps: int, episode: int = 0, seed: int = 0, textured: bool = True) -> dict[str, np.ndarray]:
    """A format-valid episode of ``n_steps`` steps with markers on frames and labels.

    Frame ``i`` has marker ``i`` (see :func:`frame_marker`) and blue channel ``episode % 256``
    in its top-left pixel. ``textured=False`` keeps frames zero elsewhere (tiny files).
    Executed actions differ from the expert labels so tests can tell which one is returned.
    """
    rng = np.random.default_rng([seed, episode, n_steps])
    n_frames = n_steps + 1
    if textured:
        observations = rng.integers(0, 256, size=(n_frames, 96, 96, 3), dtype=np.uint8)
    else:
        observations = np.zeros((n_frames, 96, 96, 3), dtype=np.uint8)
    index = np.arange(n_frames)
    observations[:, 0, 0, 0] = index % 256
    observations[:, 0, 0, 1] = index // 256
    observations[:, 0, 0, 2] = episode % 256
    expert = np.stack(
        [rng.uniform(-1, 1, n_steps), rng.uniform(0, 1, n_steps), rng.uniform(0, 1, n_steps)], axis=1
    ).astype(np.float32)
    executed = np.clip(expert + rng.normal(0, 0.1, expert.shape), [-1, 0, 0], [1, 1, 1]).astype(np.float32)
    terminations = np.zeros(n_steps, dtype=bool)
    truncations = np.zeros(n_steps, dtype=bool)
    if n_steps:
        truncations[-1] = True
    return {
        "observations": observations,
        "actions": executed,
        "expert_actions": expert,
        "rewards": rng.normal(1.0, 0.5, n_steps).astype(np.float32),
        "terminations": terminations,
        "truncations": truncations,
        "pose": rng.normal(size=(n_frames, 3)).astype(np.float32),
        "speed": rng.uniform(0, 100, n_frames).astype(np.float32),
        "lateral_error": rng.normal(size=n_frames).astype(np.float32),
        "heading_error": rng.normal(size=n_frames).astype(np.float32),
        "progress": np.cumsum(rng.uniform(0, 2, n_frames)).astype(np.float32),
        "state": rng.normal(size=(n_frames, STATE_DIM)).astype(np.float32),
    }


def synthetic_metadata(arrays: dict[str, np.ndarray], track_seed: int, colour_preset: str = "default",
                       lap_finished: bool = False, termination_reason: str = "time_limit",
                       source: str = "expert", agent_spec: str = "expert") -> dict[str, Any]:
    return {
        "track_seed": int(track_seed),
        "colour_preset": colour_preset,
        "colour_scheme": resolve_colour_scheme(colour_preset, track_seed).to_dict(),
        "source": source,
        "agent": {"agent_id": "synthetic"},
        "agent_spec": agent_spec,
        "noise": {"sigma": 0.0, "seed": 0},
        "total_reward": float(np.sum(arrays["rewards"], dtype=np.float64)),
        "lap_finished": lap_finished,
        "termination_reason": termination_reason,
    }


def write_synthetic(folder: Path, episode_id: str, n_steps: int, track_seed: int, episode: int = 0,
                    textured: bool = True, **metadata: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Write one synthetic episode; returns (sidecar, arrays)."""
    arrays = synthetic_arrays(n_steps, episode=episode, seed=track_seed, textured=textured)
    sidecar = write_episode(Path(folder), episode_id, arrays, synthetic_metadata(arrays, track_seed, **metadata))
    return sidecar, arrays


def write_raw_episode(folder: Path, episode_id: str, payload: bytes, n_steps: int, **overrides: Any) -> Path:
    """Write arbitrary npz bytes plus a sidecar whose sha256/file_size MATCH them.

    This gets past the checksum so that the later checks (shapes, dtypes, members) are reached.
    Returns the sidecar path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{episode_id}.npz").write_bytes(payload)
    sidecar = {
        "format_version": 1,
        "episode_id": episode_id,
        "file": f"{episode_id}.npz",
        "n_steps": n_steps,
        "track_seed": 0,
        "colour_preset": "default",
        "colour_scheme": resolve_colour_scheme("default", 0).to_dict(),
        "source": "expert",
        "agent": {"agent_id": "synthetic"},
        "sha256": hashlib.sha256(payload).hexdigest(),
        "file_size": len(payload),
        **overrides,
    }
    path = folder / f"{episode_id}.json"
    path.write_text(json.dumps(sidecar))
    return path


def encode_raw(arrays: dict[str, np.ndarray]) -> bytes:
    """encode_episode without write_episode's validation (so invalid episodes can be built)."""
    return encode_episode(arrays)


def replay_episode(sidecar: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Re-drive the executed actions in a fresh env; assert every stored array is reproduced.

    Observations must match exactly (lossless), the small float arrays exactly after the same
    float32 cast the recorder applies, and the expert must give the recorded labels again.
    """
    from nsacdrive.agents.expert import PurePursuitExpert
    from nsacdrive.envs import make_car_racing, privileged_state

    env = make_car_racing(colour_preset=sidecar["colour_preset"], max_episode_steps=int(sidecar["max_steps"]),
                          renderer=sidecar["renderer"])
    expert = PurePursuitExpert()
    try:
        observation, info = env.reset(seed=int(sidecar["track_seed"]))
        assert info["track_seed"] == sidecar["track_seed"]
        assert info["colour_scheme"] == sidecar["colour_scheme"]
        assert info["n_tiles"] == sidecar["n_tiles"]
        state = privileged_state(env)

        def check_state(i: int, st) -> None:
            pose = np.array([st.pose.x, st.pose.y, st.pose.angle], dtype=np.float32)
            np.testing.assert_array_equal(arrays["pose"][i], pose, err_msg=f"pose at {i}")
            assert arrays["speed"][i] == np.float32(st.pose.forward_speed), f"speed at {i}"
            assert arrays["lateral_error"][i] == np.float32(st.lateral_error), f"lateral_error at {i}"
            assert arrays["heading_error"][i] == np.float32(st.heading_error), f"heading_error at {i}"
            assert arrays["progress"][i] == np.float32(st.progress), f"progress at {i}"
            np.testing.assert_array_equal(arrays["state"][i], st.as_vector(), err_msg=f"state at {i}")

        np.testing.assert_array_equal(arrays["observations"][0], observation)
        check_state(0, state)
        n_steps = int(sidecar["n_steps"])
        for t in range(n_steps):
            label = np.asarray(expert.act(observation, state), dtype=np.float32)
            np.testing.assert_array_equal(arrays["expert_actions"][t], label, err_msg=f"expert label at {t}")
            observation, reward, terminated, truncated, _ = env.step(arrays["actions"][t])
            state = privileged_state(env)
            np.testing.assert_array_equal(arrays["observations"][t + 1], observation, err_msg=f"frame {t + 1}")
            assert arrays["rewards"][t] == np.float32(reward), f"reward at {t}"
            assert bool(arrays["terminations"][t]) == terminated
            assert bool(arrays["truncations"][t]) == truncated
            check_state(t + 1, state)
        assert terminated or truncated, "the recording stopped before the episode ended"
    finally:
        env.close()


def normalize(text: str) -> str:
    """Collapse rich box drawing and line wrapping of CLI output into single spaces."""
    for ch in "│╭╮╰╯─":
        text = text.replace(ch, " ")
    return " ".join(text.split())


def file_bytes(folder: Path) -> dict[str, bytes]:
    """name → bytes of every .npz in ``folder``."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.npz"))}
