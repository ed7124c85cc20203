"""Interpretability report: Grad-CAM, potentials, the HTML page and its files, the CLI, a real browser."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from browser import find_chromium, load_page, page_url
from data_fixtures import normalize
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.run import load_run
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.dataset import sequence_offsets, sequence_timestamps
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop
from nsacdrive.eval.explain.potentials import InternalsRecorder, band_statistics, correlations, steer_bands, unwrapped_progress
from nsacdrive.eval.explain.report import ReportConfig, write_report
from nsacdrive.eval.explain.saliency import TARGETS, GradCamUnavailable, SaliencyConfig, SaliencyInputs, grad_cam, sanity_check
from nsacdrive.eval.offline import evaluate_run, write_tables
from nsacdrive.eval.video import redrive_episode

STEPS = 40
TINY = dict(encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4)
CLEAN, SHIFTED = "run_default_seed000003_r0", "run_shift-3_seed000003_r0"


def _train(folder: Path, data: Path, model: str) -> Path:
    config = TrainConfig(data=str(data), model=ModelConfig(model=model, **TINY), train_seeds="0", val_seeds="1",
                         test_seeds="2", batch_size=8, epochs=1, max_batches_per_epoch=1, max_val_batches=1,
                         train_presets=["default"])
    Trainer(config, folder, progress=False).fit()
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report_data")
    collect(CollectConfig(agent="expert", seeds=[0, 1, 2], colour_presets=["default", "shift-3"], max_steps=80), folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def nsac_eval(data, tmp_path_factory) -> Path:
    """A tiny NSAC run (1 batch) driven on track 3, clean and shift-3, 40 steps each. Read-only."""
    folder = tmp_path_factory.mktemp("report_nsac")
    run = _train(folder / "run", data, "nsac")
    evaluate_closed_loop(EvalConfig(runs=[run], seeds=[3], colour_presets=["default", "shift-3"], drive=DriveConfig(max_steps=STEPS)), folder / "eval", progress=False)
    write_tables([evaluate_run(run, data, perturbed_preset="shift-3", max_samples=16)], folder / "offline")
    from nsacdrive.eval.monitor import MonitorConfig, run_monitor, write_monitor

    write_monitor(*run_monitor([folder / "eval"], config=MonitorConfig(windows_s=(1,), warmup_steps=5, threshold="gamma")), folder / "monitor")
    return folder / "eval"


@pytest.fixture(scope="module")
def report(nsac_eval, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report_out") / "report"
    started = time.perf_counter()
    index = write_report(nsac_eval, out, ReportConfig(offline=nsac_eval.parent / "offline", monitor=nsac_eval.parent / "monitor", frames=2))
    print(f"report on the tiny run: {time.perf_counter() - started:.1f} s")
    return index


class _References(HTMLParser):
    """Every src/href of a page, and whether it holds a script."""

    def __init__(self) -> None:
        super().__init__()
        self.references: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        self.references += [value for name, value in attrs if name in ("src", "href") and value is not None]


def test_report_page_references_only_files_beside_it(report):
    parser = _References()
    parser.feed(report.read_text())
    assert parser.scripts == 0
    assert len(parser.references) > 15
    for reference in parser.references:
        assert "://" not in reference and not reference.startswith(("/", "//", "data:")), reference
        assert (report.parent / reference).is_file(), reference
    images = [r for r in parser.references if r.endswith(".png")]
    for name in ("evaluation.png", "offline.png", "monitor-window-1s.png", "gradcam_default.png", "gradcam_shift-3.png", "sanity.png",
                 f"{CLEAN}_potentials_map.png", f"{CLEAN}_potentials_progress.png", f"{CLEAN}_potentials_steer.png"):
        assert f"figures/{name}" in images, name
    for image in images:
        assert (report.parent / image).read_bytes().startswith(b"\x89PNG"), image
    page = report.read_text()
    assert "Sanity check" in page and "ρ(steer)" in page and "mse" in page and "Misbehaviour prediction" in page
    assert not list(report.parent.rglob(".*.partial"))


def test_potentials_have_one_value_per_step_from_the_real_forward_pass(nsac_eval, report):
    import csv
    import json

    rows = list(csv.DictReader((report.parent / "data" / f"{CLEAN}_potentials.csv").open()))
    assert len(rows) == STEPS
    for name in ("phi", "kappa", "psi", "effective_time", "ou_mean", "ou_std", "attention_newest", "attention_entropy",
                 "inter", "command", "motor"):
        values = np.array([float(r[name]) for r in rows])
        assert np.all(np.isfinite(values)), name
    kappa = np.array([float(r["kappa"]) for r in rows])
    assert np.all(kappa > 0) and np.ptp(kappa) > 0  # corrected NSAC: κ depends on the input
    stats = json.loads((report.parent / "data" / f"{CLEAN}_potentials.json").read_text())["statistics"]
    steer = np.array([float(r["steer"]) for r in rows])
    assert stats["kappa"]["steer"]["pearson"] == pytest.approx(correlations(kappa, steer)["pearson"])
    assert sum(stats["kappa"]["bands"][b]["n"] for b in ("left", "straight", "right")) == STEPS
    # The recorder sees exactly what the logged closed loop saw: its attention per frame equals the log's.
    recorder = InternalsRecorder()
    arrays, frames = redrive_episode(nsac_eval, CLEAN, on_agent=recorder.attach)
    assert recorder.kind == "nsac" and len(frames) == STEPS
    logged = np.load(nsac_eval / "episodes" / f"{CLEAN}.npz")["attention"]
    np.testing.assert_allclose(recorder.neurons()["attention_per_frame"], logged, atol=1e-6)
    assert recorder.neurons()["inter"].shape[0] == STEPS


def test_correlations_and_bands_on_known_values():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    assert correlations(2 * x + 1, x) == {"pearson": pytest.approx(1.0), "spearman": pytest.approx(1.0), "n": 5}
    assert correlations(np.exp(x), -x)["spearman"] == pytest.approx(-1.0)
    assert correlations(np.exp(x), -x)["pearson"] > -1.0 + 1e-3  # monotone but not linear
    assert np.isnan(correlations(np.ones(5), x)["pearson"])
    assert correlations(np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 2.0]))["n"] == 2
    steer = np.array([-0.5, -0.1, 0.0, 0.05, 0.2, 0.9])
    assert steer_bands(steer, 0.1).tolist() == ["left", "straight", "straight", "straight", "right", "right"]
    bands = band_statistics(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 7.0]), steer, 0.1)
    assert bands["left"] == {"n": 1, "mean": 1.0, "std": 0.0}
    assert bands["straight"]["mean"] == pytest.approx(3.0) and bands["right"]["mean"] == pytest.approx(6.0)
    assert bands["right"]["std"] == pytest.approx(1.0)
    np.testing.assert_allclose(unwrapped_progress(np.array([90.0, 98.0, 3.0, 10.0, 2.0]), 100.0), [90, 98, 103, 110, 102])


@pytest.fixture(scope="module")
def saliency(data, nsac_eval):
    """The tiny NSAC run and three recorded expert frames (after the zoom-in) with their histories."""
    model, config = load_run(nsac_eval.parent / "run")
    frames = np.load(data / "expert_default_seed000000.npz")["observations"]
    offsets = sequence_offsets(config.sequence_length, config.frame_stride)
    sequences = np.stack([frames[step + offsets] for step in (55, 62, 70)])
    inputs = SaliencyInputs.from_sequences(sequences, sequence_timestamps(config.sequence_length, config.frame_stride))
    return model, inputs


def test_grad_cam_maps_are_signed_per_target_and_fail_the_randomisation_check(saliency):
    model, inputs = saliency
    config = SaliencyConfig(samples=5)
    maps = grad_cam(model, inputs, config)
    assert maps.maps.shape == (3, len(TARGETS), 84, 96) and maps.coarse.shape == (3, len(TARGETS), 7, 8)
    steer, gas = maps.maps[:, TARGETS.index("steer")], maps.maps[:, TARGETS.index("gas")]
    assert steer.min() < 0 < steer.max()  # signed: evidence for left and for right
    assert not np.allclose(steer, gas)  # another target, another map
    np.testing.assert_allclose(grad_cam(model, inputs, config).maps, maps.maps)  # fixed draws: deterministic
    check = sanity_check(model, inputs, maps, config)
    assert check.stages[0] == "to_token.1" and check.stages[-1] == "+ features.0"
    assert check.maps.shape == (4, 3, len(TARGETS), 84, 96)
    np.testing.assert_allclose(check.self_spearman, 1.0)
    k = TARGETS.index("steer")
    assert check.spearman[-1, k] < check.self_spearman[k] - 0.2  # every encoder layer randomised: the map is gone


def test_grad_cam_refuses_the_published_encoder_map():
    from nsacdrive.controllers.registry import build_controller

    model = build_controller(ModelConfig(model="gmle", **{**TINY, "encoder": EncoderConfig(kind="reference", token_dim=16)}))
    inputs = SaliencyInputs.from_sequences(np.zeros((1, 4, 96, 96, 3), np.uint8), np.zeros(4, np.float32))
    with pytest.raises(GradCamUnavailable, match="too coarse"):
        grad_cam(model, inputs)


@pytest.mark.parametrize("model, kind, names", [
    ("levy", "levy", [f"{signal}_{action}" for signal in ("evidence", "disagreement", "deviation")
                      for action in ("steer", "gas", "brake")]),
    ("gmle", "nac", ["attention_entropy", "attention_newest", "attention_newest_draw_std", "inter", "command", "motor"]),
    ("sdenet", "none", []),
])
def test_internals_of_other_heads(data, tmp_path, model, kind, names):
    """Lévy gives evidence/disagreement/σ̂ traces, NAC-based heads circuit groups and attention,
    heads without an attention circuit nothing (and a reason)."""
    run = _train(tmp_path / "run", data, model)
    evaluate_closed_loop(EvalConfig(runs=[run], seeds=[3], drive=DriveConfig(max_steps=20)), tmp_path / "eval", progress=False)
    recorder = InternalsRecorder()
    redrive_episode(tmp_path / "eval", "run_default_seed000003_r0", on_agent=recorder.attach)
    traces = recorder.traces()
    assert recorder.kind == kind and sorted(traces) == sorted(names)
    for name in names:
        assert traces[name].shape == (20,) and np.all(np.isfinite(traces[name])), name
    if kind == "levy":
        assert np.all(traces["evidence_steer"] > 0) and np.all(traces["deviation_steer"] >= 0)
    if kind == "nac":
        np.testing.assert_allclose(recorder.neurons()["attention_per_frame"].sum(1), 1.0, atol=1e-5)
    if kind == "none":
        assert "no attention circuit" in recorder.reason


def test_cli_report_exits_2_with_a_message_on_a_bad_folder(tmp_path, nsac_eval):
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "aggregates.json" in result.output
    result = runner.invoke(app, ["report", str(nsac_eval), "--out", str(tmp_path / "out"), "--episodes", "nope"])
    assert result.exit_code == 2 and "nope" in result.output
    result = runner.invoke(app, ["report", str(nsac_eval), "--out", str(tmp_path / "out"), "--offline", str(tmp_path)])
    assert result.exit_code == 2 and "offline.json" in result.output


def test_a_failed_report_leaves_no_folder_behind(tmp_path, nsac_eval):
    result = CliRunner().invoke(app, ["report", str(nsac_eval), "--out", str(tmp_path / "out"), "--offline", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "offline.json" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the report nor its staging folder


def test_a_failed_rerun_keeps_the_earlier_report_whole(tmp_path, nsac_eval, report):
    out = tmp_path / "out"
    shutil.copytree(report.parent, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, ["report", str(nsac_eval), "--out", str(out), "--offline", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_report_replaces_an_earlier_one_and_cleans_a_killed_ones_stage(tmp_path, nsac_eval, report):
    out = tmp_path / "out"
    shutil.copytree(report.parent, out)
    (out / "figures" / "left-over-from-before.png").write_bytes(b"old")
    killed = tmp_path / f".out.{_finished_pid()}.partial"
    killed.mkdir()
    index = write_report(nsac_eval, out, ReportConfig(frames=1))
    assert index == out / "index.html" and index.is_file()
    assert not (out / "figures" / "left-over-from-before.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_report_refuses_a_folder_that_holds_something_else(tmp_path, nsac_eval):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["report", str(nsac_eval), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "holds files but no report (index.html)" in normalize(result.output)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]


def _finished_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(child.stdout)


def test_report_loads_in_headless_chromium_without_errors(report, tmp_path):
    binary = find_chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH: `make test` installs it with `apt-get install chromium` where apt is "
                    "available; the report's browser check needs it")
    started = time.perf_counter()
    page = load_page(binary, page_url(report))
    assert page.errors == []
    shot = tmp_path / "report.png"
    shot.write_bytes(page.screenshot)
    import cv2

    image = cv2.imread(str(shot))
    assert image is not None and image.shape[:2] == (2000, 1280)
    assert image.std() > 20  # text, tables and figures, not a blank page
    # The detector works: a page with a missing image and a script error is caught.
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>nope();</script></body></html>')
    errors = load_page(binary, page_url(broken)).errors
    assert any("ERR_FILE_NOT_FOUND" in e for e in errors) and any("nope" in e for e in errors)
    print(f"chromium checks: {time.perf_counter() - started:.1f} s")
