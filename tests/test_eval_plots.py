"""Figures and videos of closed-loop episodes (eval/plots.py, eval/video.py, `nsacdrive plot`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from data_fixtures import normalize
from run_fixtures import tiny_run
from scipy.stats import spearmanr
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop
from nsacdrive.eval.plots import spearman, write_episode_figures, write_evaluation_figures
from nsacdrive.eval.results import choose_episodes, describe_action_settings
from nsacdrive.eval.video import DeterminismError, video_size, write_episode_video

STEPS = 30
EPISODES = ("run_default_seed000003_r0", "run_default_seed000004_r0")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory) -> Path:
    """A tiny trained run (1 batch) driven on tracks 3 and 4 for 30 steps each. Read-only."""
    folder = tmp_path_factory.mktemp("plots")
    tiny_run(folder, seeds=(0, 1), split=("0", "1", "2"))  # splits are disjoint; the test track needs no episodes
    evaluate_closed_loop(EvalConfig(runs=[folder / "run"], seeds=[3, 4], drive=DriveConfig(max_steps=STEPS)), folder / "eval", progress=False)
    return folder / "eval"


def _image(path: Path) -> np.ndarray:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, path
    image = cv2.imread(str(path))
    assert image is not None and image.shape[0] > 200 and image.shape[1] > 200, path
    return image.astype(np.float64)


def _rewrite_log(eval_dir: Path, episode_id: str, **changes: np.ndarray) -> None:
    path = eval_dir / "episodes" / f"{episode_id}.npz"
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    np.savez_compressed(path, **{**arrays, **changes})


def test_episode_figures_are_pngs_that_follow_the_data(evaluation, tmp_path):
    paths = {e: write_episode_figures(evaluation, e, tmp_path / "figs") for e in EPISODES}
    for episode_id, written in paths.items():
        assert [p.name for p in written] == [f"{episode_id}_{kind}.png" for kind in ("path", "actions", "uncertainty")]
        for path in written:
            _image(path)
    first, second = (_image(paths[e][0]) for e in EPISODES)
    assert np.abs(first - second).mean() > 1.0  # different tracks and paths → different maps
    copy = shutil.copytree(evaluation, tmp_path / "tampered")
    steps = len(np.load(copy / "episodes" / f"{EPISODES[0]}.npz")["lateral_error"])
    _rewrite_log(copy, EPISODES[0], lateral_error=np.linspace(-6, 6, steps, dtype=np.float32))
    (recoloured, *_) = write_episode_figures(copy, EPISODES[0], tmp_path / "figs2")
    changed = np.any(np.abs(_image(recoloured) - first) > 30, axis=2)
    assert changed.sum() > 20, changed.sum()  # same path, other lateral errors → other dot colours
    assert not list((tmp_path / "figs").glob(".*"))  # no temporary files left behind


def test_evaluation_figure(evaluation, tmp_path):
    (path,) = write_evaluation_figures(evaluation, tmp_path)
    assert path == tmp_path / "evaluation.png"
    _image(path)


def test_spearman_matches_scipy_with_ties_and_is_nan_when_undefined():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 50).astype(float), rng.normal(size=50)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert np.isnan(spearman(np.ones(5), y[:5])) and np.isnan(spearman([1.0], [2.0]))


def test_chosen_episodes_mix_best_and_worst_of_every_controller():
    def record(model, name, score, failed=False):
        return {"model": model, "run": f"runs/{model}", "episode_id": name, "score": score, "failed": failed}

    records = [record("a", f"a{i}", s) for i, s in enumerate([10, 50, 30, 90, 70])]
    records += [record("b", "b0", 5), record("b", "b1", 95), record("b", "b2", 999, failed=True)]
    assert choose_episodes(records) == ["a3", "b1", "a0", "b0", "a4", "a2"]
    assert choose_episodes(records, limit=2) == ["a3", "b1"]


def test_video_has_one_frame_per_step(evaluation, tmp_path):
    out = write_episode_video(evaluation, EPISODES[0], tmp_path / "v" / "episode.mp4", scale=2)
    capture = cv2.VideoCapture(str(out))
    frames = []
    while (frame := capture.read()[1]) is not None:
        frames.append(frame)
    capture.release()
    assert len(frames) == STEPS
    assert (frames[0].shape[1], frames[0].shape[0]) == video_size(2)
    assert [p.name for p in (tmp_path / "v").iterdir()] == ["episode.mp4"]


def test_video_refuses_an_episode_whose_log_does_not_replay(evaluation, tmp_path):
    copy = shutil.copytree(evaluation, tmp_path / "tampered")
    executed = np.load(copy / "episodes" / f"{EPISODES[1]}.npz")["executed_action"].copy()
    executed[10, 1] += 0.25
    _rewrite_log(copy, EPISODES[1], executed_action=executed)
    with pytest.raises(DeterminismError, match=f"{EPISODES[1]}.*from step 10 on"):
        write_episode_video(copy, EPISODES[1], tmp_path / "v" / "episode.mp4", scale=1)
    assert not (tmp_path / "v").exists() or not list((tmp_path / "v").iterdir())


def test_plot_command_writes_figures_and_videos(evaluation, tmp_path):
    result = CliRunner().invoke(app, ["plot", str(evaluation), "--out", str(tmp_path / "figs"), "--videos", "1"])
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.output.splitlines()]
    assert all(p.is_file() for p in written)
    assert sorted(p.name for p in written) == sorted(
        ["evaluation.png", f"{EPISODES[0]}.mp4"] + [f"{e}_{k}.png" for e in EPISODES for k in ("path", "actions", "uncertainty")])
    assert written[-1].parent == tmp_path / "figs" / "videos"


def test_plot_command_names_a_folder_that_is_no_evaluation(tmp_path):
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    text = normalize(result.output)
    assert text.startswith("error: ") and f"{tmp_path / 'nowhere' / 'aggregates.json'}: not found" in text


def test_plot_command_names_unknown_episodes_before_writing_anything(evaluation, tmp_path):
    result = CliRunner().invoke(app, ["plot", str(evaluation), "--episodes", f"nope,{EPISODES[0]}", "--out", str(tmp_path / "figs")])
    assert result.exit_code == 2
    assert "--episodes: no episode nope" in normalize(result.output)
    assert not (tmp_path / "figs").exists()


def test_the_severity_figure_draws_one_column_per_family_and_one_line_per_run():
    from nsacdrive.eval.plots import SEVERITY_METRICS, corruption_of_condition, severity_figure

    def row(run: str, condition: str, mse: float) -> dict:
        return {"model": "nsac", "run": run, "condition": condition, "action": "steer", "mse": mse, "coverage_90": 0.9}

    rows = [row(run, condition, mse) for run in ("a", "b")
            for condition, mse in (("clean", 1.0), ("fog-1", 2.0), ("fog-3", 3.0), ("jpeg-5", 4.0), ("shift-3", 9.0))]
    assert corruption_of_condition("fog-3") == ("fog", 3) and corruption_of_condition("shift-3") is None
    fig = severity_figure(rows, "t")
    axes = fig.axes
    assert len(axes) == 2 * len(SEVERITY_METRICS)  # fog and jpeg; the colour preset is not a corruption
    fog_mse = axes[0]
    assert fog_mse.get_title() == "fog" and len(fog_mse.lines) == 2
    np.testing.assert_array_equal(fog_mse.lines[0].get_xdata(), [0, 1, 3])  # clean at severity 0
    np.testing.assert_array_equal(fog_mse.lines[0].get_ydata(), [1.0, 2.0, 3.0])
    assert severity_figure([r for r in rows if r["condition"] in ("clean", "shift-3")], "t") is None


def test_action_settings_read_as_words():
    assert describe_action_settings({}) == "no throttle cap"
    assert describe_action_settings({"throttle_cap": 0.1, "pedal_caution": 0.5}) == "throttle cap 0.1, pedal caution 0.5"
    assert describe_action_settings({"pedal_caution": 0.5, "gas_caution": 0.0}) == "no throttle cap, pedal caution 0.5 (gas 0.0)"
