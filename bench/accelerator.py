"""Training and control on an accelerator, against this machine's CPU, side by side in one run.

* training: samples/s of NSAC steps on the quality recipe's NSAC (``configs/quality.json --model nsac``:
  CNN + speed input + NSAC, hinge on held-out proxies) at batch 64, in float32 and with the encoder
  in bfloat16 (``precision: bfloat16``), and seconds per step of the
  front-camera recipe (``configs/front-camera.json``: NVIDIA encoder, batch 32, twins for a
  quarter; target ≤ 0.3 s), each batch arriving as the data pipeline makes it (uint8,
  moved to the device, scaled there) and perturbed as the recipe says, on the CPU (one thread)
  and on CUDA;
* control: one lockstep prediction for B episodes (newest frame encoded, tokens gathered from
  the ring, the recipe's 20 draws with each episode's own stream) at B = 1, 11 and 64, on the CPU and on CUDA;
* on CUDA only: the whole front-camera training step of a real ``nsacdrive train --device cuda``
  on freshly recorded front-camera episodes, its batches gathered and augmented on the host's CPU
  while the GPU trains on the previous one (``Trainer.prefetch``).

Without a CUDA device it says so, records ``"cuda": null`` and stops (run it whenever
a machine with a GPU is available). Usage: ``python -m bench.accelerator [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import print_table, recipe, recipe_timestamps, save_results, training_step
from bench.training_speed import FRONT_CAMERA_CONFIG, FRONT_CAMERA_TARGET_S, front_camera_whole_step
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.envs.observation_kinds import observation_kind

ROOT = Path(__file__).resolve().parents[1]


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, device: torch.device, repeats: int) -> float:
    """Median seconds of ``step()`` after one warm-up call, the device drained around each call."""
    step()
    times = []
    for _ in range(repeats):
        synchronise(device)
        start = time.perf_counter()
        step()
        synchronise(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def control_latency(config: TrainConfig, device: torch.device, episodes: int, repeats: int) -> float:
    """Milliseconds of one lockstep prediction of ``config``'s model for ``episodes`` episodes (tokens
    of the newest frame encoded, the recipe's T-frame history gathered, its draws from per-episode
    CPU streams)."""
    torch.manual_seed(0)
    model = build_controller(config.model).to(device).eval()
    kind = observation_kind(config.model.observation)
    raw = np.random.default_rng(0).integers(0, 255, (episodes, *kind.raw_shape), dtype=np.uint8)
    history = None
    generators = [torch.Generator().manual_seed(k) for k in range(episodes)]
    times = recipe_timestamps(config, episodes, device)
    speed = torch.full((episodes, 1), 30.0, device=device)

    @torch.no_grad()
    def step() -> None:
        nonlocal history
        newest = model.encode(torch.from_numpy(kind.preprocess(raw))[:, None].to(device), speed)
        history = (newest.repeat(1, config.sequence_length, 1) if history is None
                   else torch.cat([history[:, newest.shape[1]:], newest], dim=1))
        prediction = model.predict_tokens(history, times, samples=config.model.predict_samples, generators=generators)
        prediction.mean.cpu()  # a driving loop reads the actions on the host

    return 1e3 * timed(step, device, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 2 if args.quick else 10
    quality, front = recipe(ROOT / "configs" / "quality.json", "nsac"), recipe(FRONT_CAMERA_CONFIG)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    results: dict[str, dict | None] = {"cpu": None, "cuda": None}
    for device in devices:
        results[device.type] = {
            "train_samples_per_s": 64 / timed(training_step(quality, 64, device), device, repeats),
            "train_samples_per_s_bfloat16": 64 / timed(training_step(dataclasses.replace(quality, precision="bfloat16"), 64, device),
                                                        device, repeats),
            "front_camera_step_s": timed(training_step(front, front.batch_size, device), device, repeats),
            "control_ms": {str(b): control_latency(quality, device, b, 3 * repeats) for b in (1, 11, 64)},
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, 1 thread",
        }
    cpu, gpu = results["cpu"], results["cuda"]
    if gpu:
        gpu["whole_front_camera_step"] = front_camera_whole_step(*((4, 300, 15) if args.quick else (6, 500, 40)), device="cuda")

    def cells(key: str, digits: int, speedup: bool = False) -> str:
        text = f"CPU {cpu[key]:.{digits}f}"
        if gpu:
            factor = gpu[key] / cpu[key] if speedup else cpu[key] / gpu[key]
            text += f" / CUDA {gpu[key]:.{digits}f} ({factor:.1f}×)"
        return text

    rows = [("training samples/s, quality NSAC, batch 64 (uint8 batches scaled on the device)", cells("train_samples_per_s", 0, True)),
            ("  the same with the encoder in bfloat16 (precision: bfloat16)", cells("train_samples_per_s_bfloat16", 0, True)),
            (f"front-camera training step s, batch {front.batch_size} (target ≤ {FRONT_CAMERA_TARGET_S} s)",
             cells("front_camera_step_s", 3))]
    for b in ("1", "11", "64"):
        rows.append((f"control ms, {b} episode(s) in lockstep, {quality.model.predict_samples} draws",
                     f"CPU {cpu['control_ms'][b]:.2f}" + (f" / CUDA {gpu['control_ms'][b]:.2f}" if gpu else "")))
    whole = gpu["whole_front_camera_step"]["step_seconds"] if gpu else None
    rows.append(("whole front-camera step s on CUDA (nsacdrive train, batches gathered ahead on the CPU), epoch 1 / 2",
                 " / ".join(f"{seconds:.3f}" for seconds in whole) if whole else "not run"))
    rows.append(("accelerator", gpu["name"] if gpu else "no CUDA device on this machine: not run"))
    print_table("training and control on an accelerator", rows)
    save_results("accelerator", args.quick, results)


if __name__ == "__main__":
    main()
