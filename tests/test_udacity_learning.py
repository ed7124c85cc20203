"""End to end on a Udacity-format recording this test makes itself: import it, train it with
configs/udacity.json, serve the run with `nsacdrive udacity serve` and drive frames it never
saw with a simulator-like client: the served steering must follow left and right bends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from udacity_fixtures import curved_road_image, write_curved_road_recording

from bench.udacity_socket_transcript import free_port, start_server
from nsacdrive.cli import app
from nsacdrive.eval.serve.udacity_server import SAFE_REPLY, encode_camera_image
from nsacdrive.eval.serve.udacity_sim_client import SimulatorClient

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "udacity.json"
#: unseen bends, each held for BLOCK frames; the last SCORED frames of a block are scored (older history is the same bend)
BENDS = (-0.9, 0.5, -0.4, 0.9, -0.6, 0.4)
BLOCK, SCORED = 6, 3
EPOCHS = 6


def invoke(*arguments: str) -> None:
    result = CliRunner().invoke(app, list(arguments))
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    """A 1000-frame curved-road recording imported in 50-step episodes (20 of them) and trained on configs/udacity.json."""
    root = tmp_path_factory.mktemp("udacity_learning")
    write_curved_road_recording(root / "recording", rows=1000, seed=0)
    invoke("udacity", "import", str(root / "recording"), "--out", str(root / "data"), "--episode-length", "50")
    invoke("train", "--data", str(root / "data"), "--config", str(CONFIG), "--out", str(root / "run"), "--epochs", str(EPOCHS))
    return root / "run"


@pytest.mark.slow
def test_served_steering_follows_left_and_right_bends_it_never_saw(served_run, tmp_path):
    rng = np.random.default_rng(123)  # other grass patches than the recording's
    port, log = free_port(), tmp_path / "frames.jsonl"
    server = start_server(served_run, port, log)
    try:
        steering: list[float] = []
        with SimulatorClient(f"ws://127.0.0.1:{port}") as sim:
            assert sim.receive() == ("steer", SAFE_REPLY)
            for bend in BENDS:
                for _ in range(BLOCK):
                    image = encode_camera_image(curved_road_image(bend, rng))
                    sim.emit("telemetry", {"steering_angle": "0", "throttle": "0.3", "speed": "20", "image": image})
                    event, data = sim.receive()
                    assert event == "steer" and data != SAFE_REPLY
                    steering.append(float(data["steering_angle"]))
    finally:
        server.terminate()
        server.wait(timeout=10)
    scored = np.array(steering).reshape(len(BENDS), BLOCK)[:, -SCORED:].mean(axis=1)
    labels = 0.6 * np.array(BENDS)  # the recording's steering law
    assert np.all(np.sign(scored) == np.sign(labels)), f"served steering {scored.round(3)} for labels {labels}"
    assert np.corrcoef(scored, labels)[0, 1] > 0.9
    assert np.abs(scored).mean() > 0.5 * np.abs(labels).mean()  # it moves the wheel, not just its sign
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == len(BENDS) * BLOCK and all(row["status"] == "ok" for row in rows)
