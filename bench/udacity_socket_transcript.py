"""Print the wire transcript of a simulator-like session against ``nsacdrive udacity serve``.

Starts ``nsacdrive udacity serve RUN`` on a free local port, connects the way the old Unity
simulator does (:class:`nsacdrive.eval.serve.udacity_sim_client.SimulatorClient`: raw websocket, EIO=4, no "40",
its own pings), sends a few telemetry frames with a synthetic road picture, one malformed frame
and one empty (manual-mode) frame, then prints every frame sent and received and the server's
per-frame log rows. Evidence that the served stack speaks the simulator's dialect.

Usage: ``python -m bench.udacity_socket_transcript RUN [--frames 3]``
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import NSACDRIVE
from nsacdrive.eval.serve.udacity_server import CAMERA_SHAPE, encode_camera_image
from nsacdrive.eval.serve.udacity_sim_client import SimulatorClient

ROOT = Path(__file__).resolve().parents[1]


def road_picture(shift: int = 0) -> np.ndarray:
    """A 320×160 camera-like RGB picture: sky, green verge, a grey road whose centre is moved by ``shift`` px."""
    height, width, _ = CAMERA_SHAPE
    image = np.empty(CAMERA_SHAPE, np.uint8)
    image[:60] = (135, 180, 230)
    image[60:] = (70, 120, 50)
    rows = np.arange(60, height)
    half = 20 + (rows - 60) * 1.4
    columns = np.arange(width)
    road = np.abs(columns[None, :] - (width / 2 + shift)) < half[:, None]
    image[60:][road] = (110, 110, 110)
    return image


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(run: Path, port: int, log: Path, timeout: float = 60.0) -> subprocess.Popen:
    """``nsacdrive udacity serve RUN --port PORT --log LOG`` in a subprocess, returned once it accepts connections.

    The server's own output goes to ``LOG`` + ``.out`` (a file, so a chatty server never blocks on a full pipe).
    """
    output = log.with_name(log.name + ".out")
    with output.open("w") as sink:
        server = subprocess.Popen([*NSACDRIVE, "udacity", "serve", str(run), "--port", str(port),
                                   "--log", str(log)], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode}:\n{output.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise TimeoutError(f"server did not listen on port {port} within {timeout:.0f} s")


def session(url: str, frames: int) -> list[str]:
    """One simulator-like session; returns its transcript."""
    with SimulatorClient(url) as sim:
        sim.receive()  # the connect-time steer
        sim.ping()
        for index in range(frames):
            speed = 5.0 * index
            sim.emit("telemetry", {"steering_angle": "0", "throttle": "0.2", "speed": f"{speed:.4f}",
                                   "image": encode_camera_image(road_picture(shift=15 * index))})
            sim.receive()
        sim.emit("telemetry", {"steering_angle": "0", "throttle": "0", "speed": "12", "image": "bm90IGEganBlZw=="})
        sim.receive()
        sim.emit("telemetry", {})
        sim.receive()
        return sim.transcript


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="Run folder from `nsacdrive train`.")
    parser.add_argument("--frames", type=int, default=3, help="Good telemetry frames to send.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        log, port = Path(folder) / "frames.jsonl", free_port()
        server = start_server(args.run, port, log)
        try:
            transcript = session(f"ws://127.0.0.1:{port}", args.frames)
        finally:
            server.terminate()
            server.wait(timeout=10)
        print(f"# simulator-like session against `nsacdrive udacity serve {args.run}` (-> client, <- server)")
        print("\n".join(transcript))
        print("\n# server log rows (--log frames.jsonl)")
        for line in log.read_text().splitlines():
            row = json.loads(line)
            print(json.dumps({key: round(value, 4) if isinstance(value, float) else value for key, value in row.items()
                              if value is not None and key != "time"}))


if __name__ == "__main__":
    main()
