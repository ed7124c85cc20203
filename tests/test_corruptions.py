"""The held-out corruption suite: names, determinism, severity, and what each family touches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.envs.corruptions import CORRUPTIONS, FAMILIES, SEVERITIES, CorruptionSpec, _grass_mask, parse_corruptions
from nsacdrive.envs.front_camera import CameraConfig


def scene(height: int, width: int) -> np.ndarray:
    """A stock-coloured frame: grass (102, 204, 102) around a grey road band with white lines."""
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = (102, 204, 102)
    frame[:, width // 3 : 2 * width // 3] = (102, 102, 102)
    frame[:, width // 2 - 1 : width // 2 + 1] = 255
    return frame


FRAMES = {"carracing": scene(96, 96), "front-camera": scene(*CameraConfig().shape[:2])}


def test_the_suite_has_at_least_ten_families_at_five_severities():
    assert len(FAMILIES) >= 10 and SEVERITIES == (1, 2, 3, 4, 5)
    assert len(parse_corruptions("all")) == 5 * len(FAMILIES)


@pytest.mark.parametrize("kind", sorted(FRAMES))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_corruption_keeps_the_frame_format_changes_it_and_is_deterministic(kind, family):
    frame = FRAMES[kind]
    spec = CorruptionSpec(family, 3)
    out = spec(frame, seed=1, step=7)
    assert out.dtype == np.uint8 and out.shape == frame.shape
    assert not np.array_equal(out, frame)
    assert np.array_equal(out, spec(frame, seed=1, step=7))
    assert np.array_equal(frame, FRAMES[kind])  # the input is not modified


DETERMINISTIC = ("defocus-blur", "jpeg", "pixelate", "camera-zoom")  # no random draw at all
PER_EPISODE = ("glare", "occluder", "water-drops", "camera-shift")  # drawn once per episode


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in DETERMINISTIC])
def test_stochastic_families_draw_anew_for_another_step_or_seed(family):
    frame = FRAMES["front-camera"]
    spec = CorruptionSpec(family, 3)
    first = spec(frame, seed=1, step=7)
    assert not np.array_equal(first, spec(frame, seed=1, step=8)) or not np.array_equal(first, spec(frame, seed=2, step=7))


@pytest.mark.parametrize("family", PER_EPISODE)
def test_per_episode_families_stay_put_within_an_episode_and_move_between_episodes(family):
    frame = FRAMES["front-camera"]
    spec = CorruptionSpec(family, 3)
    assert CORRUPTIONS[family].per_episode
    np.testing.assert_array_equal(spec(frame, seed=1, step=7), spec(frame, seed=1, step=400))
    assert not np.array_equal(spec(frame, seed=1, step=7), spec(frame, seed=2, step=7))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "background-texture"])
def test_higher_severity_moves_the_frame_further_from_the_clean_one(family):
    """Mean |corrupted − clean| over 8 steps grows with severity (1 < 3 < 5)."""
    frame = FRAMES["front-camera"].astype(np.float64)
    change = [np.mean([np.abs(CorruptionSpec(family, s)(FRAMES["front-camera"], 0, step) - frame).mean() for step in range(8)])
              for s in (1, 3, 5)]
    assert change[0] < change[1] < change[2], change


def test_the_background_texture_replaces_the_grass_only_and_its_contrast_grows():
    frame = FRAMES["carracing"]
    grass = _grass_mask(frame)
    spreads = []
    for severity in (1, 5):
        out = CorruptionSpec("background-texture", severity)(frame, seed=3, step=0)
        assert np.array_equal(out[~grass], frame[~grass])  # road and lines untouched
        assert not np.any(np.all(out[grass] == (102, 204, 102), axis=-1))
        spreads.append(out[grass].astype(float).std(0).mean())
    assert spreads[0] < spreads[1]


def test_parse_reads_names_and_refuses_what_is_not_in_the_suite():
    assert [s.name for s in parse_corruptions("fog-3, jpeg-1")] == ["fog-3", "jpeg-1"]
    every_third = parse_corruptions("all-1, all-3")
    assert [s.name for s in every_third] == [f"{f}-1" for f in FAMILIES] + [f"{f}-3" for f in FAMILIES]
    for bad in ("fog-6", "smoke-1", "fog", "fog-3,fog-3", "all-6", "all-3,fog-3"):
        with pytest.raises(ValueError, match="--corruptions"):
            parse_corruptions(bad)


def test_a_wrong_frame_is_refused_with_the_corruption_named():
    with pytest.raises(ValueError, match="fog-2: expected a uint8"):
        CorruptionSpec("fog", 2)(np.zeros((8, 8, 3), np.float32), 0, 0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), step=st.integers(0, 10_000), index=st.integers(0, len(FAMILIES) * 5 - 1))
def test_any_seed_and_step_give_a_valid_frame(seed, step, index):
    spec = parse_corruptions("all")[index]
    out = spec(FRAMES["carracing"], seed, step)
    assert out.shape == (96, 96, 3) and out.dtype == np.uint8


def test_env_corruptions_lists_one_family_per_line_name_first():
    result = CliRunner().invoke(app, ["env", "corruptions"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(FAMILIES)


# --------------------------------------------------------------------------- offline evaluation


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from run_fixtures import tiny_run

    return tiny_run(tmp_path_factory.mktemp("corrupt"), seeds=(0, 1, 2, 3), split=("0-1", "2", "3"))


def test_a_corrupted_dataset_corrupts_each_frame_by_its_track_and_step(run):
    from nsacdrive.data_collection.dataset import SequenceDataset

    spec = CorruptionSpec("gaussian-noise", 4)
    clean = SequenceDataset(run.parent / "data", [3])
    corrupted = SequenceDataset(run.parent / "data", [3], corruption=spec)
    first, second = corrupted[0], corrupted[1]  # consecutive sequences share T − 1 frames (stride 1)
    assert torch_equal(first["frames"][1:], second["frames"][:-1])
    assert not torch_equal(first["frames"], clean[0]["frames"])
    assert torch_equal(first["action"], clean[0]["action"])  # labels untouched


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_evaluate_offline_adds_one_condition_per_corruption_with_its_auroc(run, tmp_path):
    import json

    result = CliRunner().invoke(app, ["evaluate-offline", str(run), "--data", str(run.parent / "data"), "--corruptions",
                                      "fog-5,impulse-noise-3", "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    (saved,) = json.loads((tmp_path / "table" / "offline.json").read_text())["results"]
    assert set(saved["conditions"]) == {"clean", "fog-5", "impulse-noise-3"}
    assert set(saved["ood_auroc_conditions"]) == {"fog-5", "impulse-noise-3"}
    assert all(0.0 <= aurocs[key] <= 1.0 for aurocs in saved["ood_auroc_conditions"].values()
               for key in ("steer", "gas", "brake", "mean_std"))
    fog = saved["conditions"]["fog-5"]["per_action"]["steer"]["mse"]
    assert fog != saved["conditions"]["clean"]["per_action"]["steer"]["mse"]  # the frames did change
    bad = CliRunner().invoke(app, ["evaluate-offline", str(run), "--data", str(run.parent / "data"), "--corruptions", "fog-9",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "fog-9" in bad.output


# --------------------------------------------------------------------------- closed loop


def test_closed_loop_drives_each_corruption_as_its_own_condition(run, tmp_path):
    import json

    from nsacdrive.eval.closed_loop import DriveConfig, EpisodeKey, EvalConfig, evaluate_closed_loop

    config = EvalConfig(runs=[str(run)], seeds=[5], corruptions=("none", "lens-dirt-5"), drive=DriveConfig(max_steps=40))
    rows = evaluate_closed_loop(config, tmp_path / "eval", progress=False)
    assert [(r["colour_preset"], r["corruption"]) for r in rows] == [("default", "lens-dirt-5"), ("default", "none")]
    clean, dirty = EpisodeKey(str(run), "default", 5, 0), EpisodeKey(str(run), "default", 5, 0, "lens-dirt-5")
    assert dirty.episode_id == clean.episode_id + "_lens-dirt-5"
    record = json.loads((tmp_path / "eval" / "episodes" / f"{dirty.episode_id}.json").read_text())
    assert record["corruption"] == "lens-dirt-5" and record["steps"] == 40
    clean_log = np.load(tmp_path / "eval" / "episodes" / f"{clean.episode_id}.npz")
    dirty_log = np.load(tmp_path / "eval" / "episodes" / f"{dirty.episode_id}.npz")
    assert not np.array_equal(clean_log["raw_action"], dirty_log["raw_action"])  # the controller saw other frames
    evaluate_closed_loop(config, tmp_path / "again", progress=False)  # the same groups: bit for bit (deterministic in (seed, step))
    again = np.load(tmp_path / "again" / "episodes" / f"{dirty.episode_id}.npz")
    np.testing.assert_array_equal(again["raw_action"], dirty_log["raw_action"])
    settings = json.loads((tmp_path / "eval" / "aggregates.json").read_text())
    assert settings["corruptions"] == ["none", "lens-dirt-5"]
    with pytest.raises(ValueError, match="fog-9"):
        EvalConfig(runs=[str(run)], seeds=[5], corruptions=("fog-9",))


def test_eval_command_takes_corruptions_and_names_them_in_its_table(run, tmp_path):
    result = CliRunner().invoke(app, ["eval", str(run), "--seeds", "5", "--max-steps", "20", "--workers", "1",
                                      "--corruption", "none,jpeg-5", "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    assert "default+jpeg-5" in result.output


def test_eval_reads_a_severity_of_every_family_beside_none():
    from nsacdrive.cli import _closed_loop_corruptions

    assert _closed_loop_corruptions("none, all-5") == ("none", *(f"{family}-5" for family in FAMILIES))
    assert len(_closed_loop_corruptions("all")) == 5 * len(FAMILIES)
    with pytest.raises(ValueError, match="--corruption: 'fog-0'"):
        _closed_loop_corruptions("none,fog-0")
