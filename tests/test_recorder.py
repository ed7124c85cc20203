"""The recorder (data_collection/recorder.py) on the real CarRacing env, kept short.

One session-scoped recording (2 seeds × preset ``random`` × 80 steps, ~2 s) is shared by the
read-only tests; tests that mutate a dataset work on a copy in their own tmp_path.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import file_bytes, replay_episode
from hypothesis import given
from hypothesis import strategies as st

from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.rollout import apply_action_noise, termination_reason
from nsacdrive.common.resume import SETTINGS_FILE
from nsacdrive.data_collection.dataset import SequenceDataset, network_frames
from nsacdrive.data_collection.episode import SIDECAR_FIELDS, encode_episode, load_episode_arrays
from nsacdrive.data_collection.manifest import MANIFEST_FIELDS, MANIFEST_NAME, build_manifest, sidecar_paths
from nsacdrive.data_collection.recorder import CollectConfig, EpisodeJob, NoiseConfig, collect, episode_is_complete, run_episode
from nsacdrive.envs.car_racing import ENV_ID
from nsacdrive.envs.colours import resolve_colour_scheme
from nsacdrive.envs.observation import PREPROCESS_VERSION, preprocess_observation
from nsacdrive.envs.state import STATE_FIELDS

SEEDS = [3, 7]
PRESET = "random"  # colours differ per seed, so the sidecar's scheme is checked per episode
STEPS = 80
IDS = {seed: f"expert_{PRESET}_seed{seed:06d}" for seed in SEEDS}


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """(folder, CollectionSummary) of the shared recording. Treat as read-only."""
    out = tmp_path_factory.mktemp("recorded")
    summary = collect(CollectConfig(agent="expert", seeds=SEEDS, colour_presets=[PRESET], max_steps=STEPS), out, progress=False)
    return out, summary


def _copy(recorded_dir: Path, dest: Path) -> Path:
    shutil.copytree(recorded_dir, dest)  # copy2: keeps mtimes
    return dest


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


# --------------------------------------------------------------------------- what a recording holds


def test_collect_writes_one_episode_per_seed_and_a_manifest(recorded):
    out, summary = recorded
    assert (summary.written, summary.skipped, summary.steps) == (2, 0, 2 * STEPS)
    assert summary.seconds > 0 and summary.steps_per_second == pytest.approx(summary.steps / summary.seconds)
    expected = sorted([f"{IDS[s]}.npz" for s in SEEDS] + [f"{IDS[s]}.json" for s in SEEDS] + [MANIFEST_NAME, SETTINGS_FILE])
    assert sorted(p.name for p in out.iterdir()) == expected  # no temp files left behind


@pytest.mark.parametrize("seed", SEEDS)
def test_sidecar_fields(recorded, seed):
    out, _ = recorded
    sidecar, arrays = load_episode_arrays(out / f"{IDS[seed]}.json")
    assert set(SIDECAR_FIELDS) <= set(sidecar)
    assert sidecar["episode_id"] == IDS[seed]
    assert sidecar["file"] == f"{IDS[seed]}.npz"
    assert sidecar["track_seed"] == seed
    assert sidecar["colour_preset"] == PRESET
    assert sidecar["colour_scheme"] == resolve_colour_scheme(PRESET, seed).to_dict()
    assert sidecar["source"] == "expert"
    assert sidecar["agent"] == PurePursuitExpert().config()
    assert sidecar["agent"]["agent_id"] == "pure-pursuit"
    assert sidecar["agent_spec"] == "expert"
    assert sidecar["noise"] == {"sigma": 0.0, "seed": 0}
    assert sidecar["n_steps"] == STEPS
    assert sidecar["max_steps"] == STEPS
    assert sidecar["env_id"] == ENV_ID
    assert sidecar["state_fields"] == list(STATE_FIELDS)
    assert sidecar["preprocess"] == PREPROCESS_VERSION
    assert len(sidecar["sha256"]) == 64 and int(sidecar["sha256"], 16) >= 0
    assert sidecar["file_size"] == (out / sidecar["file"]).stat().st_size
    # 80 steps are far from a lap: the episode is cut by the time limit
    assert sidecar["termination_reason"] == "time_limit"
    assert sidecar["lap_finished"] is False
    assert sidecar["total_reward"] == pytest.approx(float(np.sum(arrays["rewards"], dtype=np.float64)), abs=1e-9)


def test_colour_schemes_differ_between_seeds_with_random_preset(recorded):
    out, _ = recorded
    schemes = [json.loads((out / f"{IDS[s]}.json").read_text())["colour_scheme"] for s in SEEDS]
    assert schemes[0] != schemes[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_arrays_are_consistent(recorded, seed):
    out, _ = recorded
    _, a = load_episode_arrays(out / f"{IDS[seed]}.json")
    assert a["observations"].shape == (STEPS + 1, 96, 96, 3)
    assert a["state"].shape == (STEPS + 1, len(STATE_FIELDS))
    # no noise: executed == label, inside the action box
    np.testing.assert_array_equal(a["actions"], a["expert_actions"])
    assert np.all(a["actions"][:, 0] >= -1) and np.all(a["actions"][:, 0] <= 1)
    assert np.all(a["actions"][:, 1:] >= 0) and np.all(a["actions"][:, 1:] <= 1)
    # the expert actually drives (some gas) and steers
    assert a["actions"][:, 1].max() > 0.1
    assert np.abs(a["actions"][:, 0]).max() > 0
    # truncated exactly at the last step
    assert not a["terminations"].any()
    np.testing.assert_array_equal(a["truncations"], np.arange(STEPS) == STEPS - 1)
    # the per-step arrays agree with the privileged state vector
    col = {name: i for i, name in enumerate(STATE_FIELDS)}
    np.testing.assert_array_equal(a["lateral_error"], a["state"][:, col["lateral_error"]])
    np.testing.assert_array_equal(a["heading_error"], a["state"][:, col["heading_error"]])
    np.testing.assert_array_equal(a["speed"], a["state"][:, col["forward_speed"]])
    assert a["speed"][0] == pytest.approx(0.0, abs=1e-3) and a["speed"][-1] > 5.0
    assert a["progress"][-1] > a["progress"][0]
    # real rendered pixels, not the render-free blank frame; the car moves so frames change
    assert a["observations"].max() > 0
    assert not np.array_equal(a["observations"][1], a["observations"][-1])


@pytest.mark.parametrize("seed", SEEDS)
def test_recording_is_lossless_replay_in_fresh_env(recorded, seed):
    out, _ = recorded
    sidecar, arrays = load_episode_arrays(out / f"{IDS[seed]}.json")
    replay_episode(sidecar, arrays)


def test_manifest_lists_the_episodes(recorded):
    out, _ = recorded
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest == build_manifest(out)
    assert manifest["n_episodes"] == 2
    assert manifest["n_steps"] == 2 * STEPS
    assert manifest["unreadable_sidecars"] == []
    assert [e["episode_id"] for e in manifest["episodes"]] == [IDS[s] for s in SEEDS]
    for entry, seed in zip(manifest["episodes"], SEEDS):
        assert set(entry) == set(MANIFEST_FIELDS)
        assert entry["file"] == f"{IDS[seed]}.npz"
        assert entry["track_seed"] == seed
        assert entry["colour_preset"] == PRESET
        assert entry["source"] == "expert" and entry["agent_spec"] == "expert"
        assert entry["n_steps"] == STEPS
        assert entry["termination_reason"] == "time_limit" and entry["lap_finished"] is False


def test_manifest_reports_unreadable_sidecars(recorded, tmp_path):
    out = _copy(recorded[0], tmp_path / "data")
    (out / f"{IDS[7]}.json").write_text("{ broken")
    manifest = build_manifest(out)
    assert manifest["n_episodes"] == 1 and manifest["n_steps"] == STEPS
    assert len(manifest["unreadable_sidecars"]) == 1 and IDS[7] in manifest["unreadable_sidecars"][0]


def test_dataset_over_a_real_recording(recorded):
    out, _ = recorded
    ds = SequenceDataset(out, sequence_length=3, frame_stride=2, skip_intro=0, cache_episodes=2)
    assert len(ds) == 2 * (STEPS - 4)
    assert ds.track_seeds == SEEDS
    _, arrays = load_episode_arrays(out / f"{IDS[7]}.json")
    item = ds[len(ds) - 1]  # last sample of the seed-7 episode
    assert int(item["step"]) == STEPS - 1
    np.testing.assert_array_equal(network_frames(item["frames"], ds.kind).numpy(),
                                  preprocess_observation(arrays["observations"][[75, 77, 79]]))
    np.testing.assert_array_equal(item["action"].numpy(), arrays["expert_actions"][79])


# --------------------------------------------------------------------------- determinism


def test_same_seed_gives_byte_identical_files(recorded, tmp_path):
    out, _ = recorded
    again = tmp_path / "again"
    summary = collect(CollectConfig(agent="expert", seeds=[3], colour_presets=[PRESET], max_steps=STEPS), again, progress=False)
    assert summary.written == 1
    name = IDS[3]
    assert (again / f"{name}.npz").read_bytes() == (out / f"{name}.npz").read_bytes()
    assert json.loads((again / f"{name}.json").read_text()) == json.loads((out / f"{name}.json").read_text())


def test_encode_of_rerun_equals_file(recorded):
    out, _ = recorded
    arrays, metadata = run_episode(EpisodeJob("expert", 7, PRESET, NoiseConfig(), STEPS))
    assert encode_episode(arrays) == (out / f"{IDS[7]}.npz").read_bytes()
    sidecar = json.loads((out / f"{IDS[7]}.json").read_text())
    assert {k: sidecar[k] for k in metadata} == metadata


def test_two_workers_give_the_same_bytes_as_one(recorded, tmp_path):
    out, _ = recorded
    parallel = tmp_path / "parallel"
    summary = collect(CollectConfig(agent="expert", seeds=SEEDS, colour_presets=[PRESET], max_steps=STEPS, workers=2), parallel, progress=False)
    assert (summary.written, summary.skipped, summary.steps) == (2, 0, 2 * STEPS)
    assert file_bytes(parallel) == file_bytes(out)
    assert len(file_bytes(out)) == 2
    for seed in SEEDS:
        assert (parallel / f"{IDS[seed]}.json").read_bytes() == (out / f"{IDS[seed]}.json").read_bytes()
    assert (parallel / MANIFEST_NAME).read_bytes() == (out / MANIFEST_NAME).read_bytes()


# --------------------------------------------------------------------------- resume after a crash


def _crash_sidecar_deleted(folder: Path, victim: str) -> None:
    (folder / f"{victim}.json").unlink()
    (folder / ".x.partial").write_bytes(b"stray temp file")


def _crash_npz_truncated(folder: Path, victim: str) -> None:
    data = folder / f"{victim}.npz"
    data.write_bytes(data.read_bytes()[:1000])
    (folder / f".{victim}.npz.k1ll3d.partial").write_bytes(b"half")


def _crash_npz_deleted(folder: Path, victim: str) -> None:
    (folder / f"{victim}.npz").unlink()


def _crash_during_npz_write(folder: Path, victim: str) -> None:
    # killed while writing the .npz: only its temp file exists, no sidecar yet
    (folder / f"{victim}.json").unlink()
    (folder / f"{victim}.npz").rename(folder / f".{victim}.npz.abcd.partial")


def _crash_sidecar_garbled(folder: Path, victim: str) -> None:
    (folder / f"{victim}.json").write_text('{"format_version": 1, "episode_id": ')


@pytest.mark.parametrize(
    "crash", [_crash_sidecar_deleted, _crash_npz_truncated, _crash_npz_deleted, _crash_during_npz_write, _crash_sidecar_garbled],
    ids=lambda f: f.__name__.removeprefix("_crash_"),
)
def test_resume_rerecords_only_the_broken_episode(recorded, tmp_path, crash):
    original, _ = recorded
    folder = _copy(original, tmp_path / "data")
    victim, survivor = IDS[7], IDS[3]
    crash(folder, victim)
    before = {p.name: _stat(p) for p in (folder / f"{survivor}.npz", folder / f"{survivor}.json")}

    summary = collect(CollectConfig(agent="expert", seeds=SEEDS, colour_presets=[PRESET], max_steps=STEPS), folder, resume=True, progress=False)

    assert (summary.written, summary.skipped, summary.steps) == (1, 1, STEPS)
    assert {name: _stat(folder / name) for name in before} == before  # untouched survivor
    assert file_bytes(folder) == file_bytes(original)  # re-recorded episode is identical
    assert json.loads((folder / f"{victim}.json").read_text()) == json.loads((original / f"{victim}.json").read_text())
    assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]
    assert json.loads((folder / MANIFEST_NAME).read_text())["n_episodes"] == 2


@pytest.mark.parametrize("layout", ["episodes", "udacity"])
def test_a_collection_that_dies_leaves_no_temporary_files(tmp_path, monkeypatch, layout):
    import nsacdrive.data_collection.recorder as recorder

    def killed_while_writing(job, out, layout):
        folder = Path(out) / ("episodes" if layout == "udacity" else "")
        (folder / f".{job.episode_id}.json.abc.partial").write_bytes(b"half")
        raise RuntimeError("worker died")

    monkeypatch.setattr(recorder, "record_episode", killed_while_writing)
    env = "udacity-style" if layout == "udacity" else "carracing"
    with pytest.raises(RuntimeError, match="worker died"):
        collect(CollectConfig(agent="expert", seeds=[3], max_steps=10, env=env, layout=layout), tmp_path, progress=False)
    assert not [p for p in tmp_path.rglob("*.partial")]


def test_resume_on_a_complete_folder_writes_nothing(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "data")
    before = {p.name: _stat(p) for p in folder.glob("*.npz")} | {p.name: _stat(p) for p in folder.glob("expert*.json")}
    summary = collect(CollectConfig(agent="expert", seeds=SEEDS, colour_presets=[PRESET], max_steps=STEPS), folder, resume=True, progress=False)
    assert (summary.written, summary.skipped, summary.steps) == (0, 2, 0)
    assert {name: _stat(folder / name) for name in before} == before


def test_existing_episodes_without_resume_raise_naming_resume(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "data")
    (folder / f"{IDS[7]}.json").unlink()  # even a partly complete folder is refused
    before = {p.name: _stat(p) for p in folder.iterdir()}
    with pytest.raises(FileExistsError) as excinfo:
        collect(CollectConfig(agent="expert", seeds=SEEDS, colour_presets=[PRESET], max_steps=STEPS), folder, progress=False)
    message = str(excinfo.value)
    assert "--resume" in message and str(folder) in message
    assert "1 of these episodes already exist" in message and IDS[3] in message
    assert {p.name: _stat(p) for p in folder.iterdir()} == before  # nothing recorded or rewritten


def test_episode_is_complete(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "data")
    job = EpisodeJob("expert", 3, PRESET, NoiseConfig(), STEPS)
    assert episode_is_complete(folder, job)
    assert not episode_is_complete(folder, EpisodeJob("expert", 4, PRESET, NoiseConfig(), STEPS))
    data = folder / f"{IDS[3]}.npz"
    data.write_bytes(data.read_bytes() + b"\0")
    assert not episode_is_complete(folder, job)


# --------------------------------------------------------------------------- argument checks


def test_collect_validates_before_creating_anything(tmp_path):
    with pytest.raises(ValueError, match="unknown colour preset 'neon'"):
        collect(CollectConfig(agent="expert", seeds=[0], colour_presets=["default", "neon"], max_steps=10), tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="--agent: unknown agent 'pilot'"):
        collect(CollectConfig(agent="pilot", seeds=[0], max_steps=10), tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match=re.escape("collect config workers must be in [1, 4096], got 0")):
        collect(CollectConfig(agent="expert", seeds=[0], max_steps=10, workers=0), tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="collect config seeds: listed twice: 0$"):
        CollectConfig(agent="expert", seeds=[0, 0])
    assert list(tmp_path.iterdir()) == []


def test_an_episode_longer_than_memory_allows_is_refused():
    with pytest.raises(ValueError, match=re.escape("collect config max_steps must be in [1, 100000], got 1000000000")):
        CollectConfig(agent="expert", seeds=[0], max_steps=10**9)


@pytest.mark.parametrize("sigma", [-0.1, math.inf, math.nan, 2.5, "0.1", True])
def test_noise_config_rejects_what_is_no_noise_std(sigma):
    with pytest.raises(ValueError, match=r"--noise must be a number in \[0, 2.0\]"):
        NoiseConfig(sigma)


@pytest.mark.parametrize(
    ("job", "episode_id"),
    [
        (EpisodeJob("expert", 5, "default"), "expert_default_seed000005"),
        (EpisodeJob("expert", 123456, "shift-3"), "expert_shift-3_seed123456"),
        (EpisodeJob("expert", 5, "default", NoiseConfig(0.25, 3)), "expert_default_seed000005_noise0.25-3"),
        (EpisodeJob("expert", 5, "default", NoiseConfig(0.0, 3)), "expert_default_seed000005"),
        (EpisodeJob("ppo:runs/a", 1, "random-7"), "ppo-runs-a_random-7_seed000001"),
    ],
)
def test_episode_ids(job, episode_id):
    assert job.episode_id == episode_id


@pytest.mark.parametrize(
    ("terminated", "truncated", "info", "reason"),
    [
        (True, False, {"lap_finished": True}, "lap_finished"),
        (True, False, {"lap_finished": False}, "left_playfield"),
        (True, False, {}, "left_playfield"),
        (False, True, {"lap_finished": False}, "time_limit"),
        (True, True, {"lap_finished": True}, "lap_finished"),
        (False, False, {}, "running"),
    ],
)
def test_termination_reason(terminated, truncated, info, reason):
    assert termination_reason(terminated, truncated, info) == reason


# --------------------------------------------------------------------------- action noise


NOISE = NoiseConfig(sigma=0.3, seed=1)
NOISY_STEPS = 60


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    out = tmp_path_factory.mktemp("noisy")
    collect(CollectConfig(agent="expert", seeds=[3], noise=NOISE, max_steps=NOISY_STEPS), out, progress=False)
    episode_id = "expert_default_seed000003_noise0.3-1"
    sidecar, arrays = load_episode_arrays(out / f"{episode_id}.json")
    return out / f"{episode_id}.npz", sidecar, arrays


def test_noise_perturbs_only_the_executed_action(noisy):
    _, sidecar, a = noisy
    assert sidecar["noise"] == {"sigma": 0.3, "seed": 1}
    assert sidecar["n_steps"] == NOISY_STEPS
    executed, label = a["actions"], a["expert_actions"]
    differs = np.any(executed != label, axis=1)
    assert differs.mean() > 0.9
    # inside the action box, and noise never presses gas and brake together
    assert np.all(np.abs(executed[:, 0]) <= 1) and np.all(executed[:, 1:] >= 0) and np.all(executed[:, 1:] <= 1)
    assert not np.any((executed[:, 1] > 0) & (executed[:, 2] > 0))


def test_noise_stream_is_the_documented_one(noisy):
    # executed[t] = apply_action_noise(label[t]) with rng seeded by [noise seed, track seed]
    _, _, a = noisy
    rng = np.random.default_rng([NOISE.seed, 3])
    for t in range(NOISY_STEPS):
        np.testing.assert_array_equal(a["actions"][t], apply_action_noise(a["expert_actions"][t], rng, NOISE.sigma))


def test_noisy_recording_replays_losslessly(noisy):
    _, sidecar, arrays = noisy
    replay_episode(sidecar, arrays)


def test_noise_is_reproducible_and_salted_by_its_seed(noisy):
    path, _, a = noisy
    same, _ = run_episode(EpisodeJob("expert", 3, "default", NOISE, NOISY_STEPS))
    assert encode_episode(same) == path.read_bytes()
    other, metadata = run_episode(EpisodeJob("expert", 3, "default", NoiseConfig(0.3, 2), NOISY_STEPS))
    assert metadata["noise"] == {"sigma": 0.3, "seed": 2}
    assert np.mean(np.any(other["actions"] != a["actions"], axis=1)) > 0.9


action_strategy = st.tuples(
    st.floats(-1, 1, width=32), st.floats(0, 1, width=32), st.floats(0, 1, width=32)
).map(lambda t: np.array(t, dtype=np.float32))


@given(action_strategy, st.floats(0.001, 3.0), st.integers(0, 2**32 - 1))
def test_apply_action_noise_properties(action, sigma, seed):
    noisy_action = apply_action_noise(action, np.random.default_rng(seed), sigma)
    assert noisy_action.dtype == np.float32 and noisy_action.shape == (3,)
    assert -1 <= noisy_action[0] <= 1
    assert 0 <= noisy_action[1] <= 1 and 0 <= noisy_action[2] <= 1
    assert noisy_action[1] == 0 or noisy_action[2] == 0
    again = apply_action_noise(action, np.random.default_rng(seed), sigma)
    np.testing.assert_array_equal(noisy_action, again)
    # the pedal noise acts on gas − brake
    steer_noise, pedal_noise = np.random.default_rng(seed).normal(0.0, sigma, size=2)
    pedal = float(action[1] - action[2]) + pedal_noise
    assert noisy_action[1] == np.float32(np.clip(pedal, 0, 1))
    assert noisy_action[0] == np.float32(np.clip(action[0] + steer_noise, -1, 1))


def test_zero_noise_returns_the_label_unchanged_and_draws_nothing():
    action = np.array([0.2, 0.5, 0.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert apply_action_noise(action, rng, 0.0) is action
    assert rng.normal() == np.random.default_rng(0).normal()  # the stream was not advanced


def test_pygame_runs_headless():
    # conftest sets these before anything imports pygame; recorder workers take them from this process
    import os

    assert os.environ["SDL_VIDEODRIVER"] == "dummy"
    assert os.environ["SDL_AUDIODRIVER"] == "dummy"


def test_recordings_use_the_fast_renderer_by_default_and_say_so(recorded, tmp_path):
    folder, _ = recorded
    sidecars = [json.loads(p.read_text()) for p in sidecar_paths(folder)]
    assert sidecars and all(s["renderer"] == "fast" for s in sidecars)
    collect(CollectConfig(agent="expert", seeds=[3], max_steps=20, renderer="stock"), tmp_path / "stock", progress=False)
    stock = json.loads(next((tmp_path / "stock").glob("expert_*.json")).read_text())
    assert stock["renderer"] == "stock"
    with pytest.raises(ValueError, match="collect config renderer: expected one of stock, fast, got 'gl'"):
        CollectConfig(agent="expert", seeds=[3], renderer="gl")
