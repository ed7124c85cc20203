"""Controller speed: training samples/s per model and one-frame control latency.

* training: samples/s of one optimiser step (loss incl. MC draws and perturbed passes,
  backward, AdamW) at batch 64 on T = 4 frames, per model;
* control: latency of ``ControllerAgent``-style prediction for one new frame (preprocess +
  encoder over the T-frame window + head), deterministic (1 draw) vs with uncertainty
  (the model's own number of draws, batched inside the head). Target: ≤ 10 ms per step;
* NSAC's perturbed twins: samples/s with twins for a share of each batch
  (``TrainConfig.twin_fraction``) against twins for all of it, steps alternated pair by pair
  (issue 19's target: NSAC training ≥ 2× at batch 64);
* the front-camera step: seconds per batch of 32 of ``configs/front-camera.json``'s model (NVIDIA
  encoder on 66×200 YUV frames, twins for a quarter), the encoder fed channels-last frames (what
  it does) against the default layout, steps alternated, and on one thread against all cores
  (issue 19's target: ≤ 0.3 s);
* memory: peak resident memory of the demo training (``configs/demo.json``, one epoch, on
  ``data/demo`` when present), sampled with psutil. Target: ≤ 4 GB.

One thread (torch.set_num_threads(1)): "per step on one core", except the front-camera step's
all-cores row. Usage:
``python -m bench.training_speed [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common import PeakRss, median_time, paired_median_ratio, recipe, save_results
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.ood_proxies import make_perturbation
from nsacdrive.controllers.registry import MODEL_BUILDERS, build_controller
from nsacdrive.envs.observation import preprocess_observation

ROOT = Path(__file__).resolve().parents[1]

MODELS = sorted(set(MODEL_BUILDERS) | {"ensemble"})
TWIN_FRACTIONS = (0.5, 0.25, 0.125)
TWIN_TARGET = 2.0


FRONT_CAMERA_CONFIG = ROOT / "configs" / "front-camera.json"
FRONT_CAMERA_TARGET_S = 0.3


def training_step(model: str | ModelConfig, batch: int, twin_fraction: float = 1.0, channels_last: bool | None = None):
    """One optimiser step of ``model`` (a name, or a whole config) on a fixed random batch, as a
    callable; ``channels_last`` overrides the encoder's frame layout."""
    torch.manual_seed(0)
    config = model if isinstance(model, ModelConfig) else ModelConfig(model=model)
    controller = build_controller(config).train()
    if channels_last is not None:
        controller.encoder.CHANNELS_LAST = channels_last
    optimizer = torch.optim.AdamW(controller.parameters(), 1e-3)
    frames = torch.rand(batch, 4, *config.encoder.frame_shape)
    timestamps = torch.tensor([[-0.12, -0.08, -0.04, 0.0]]).expand(batch, 4)
    target = torch.rand(batch, 3)
    speeds = torch.rand(batch, 4) if config.speed_input else None
    perturb = make_perturbation("noise", torch.Generator().manual_seed(0), 0.0, 0.2, twin_fraction)

    def step() -> None:
        loss = controller.training_loss(frames, timestamps, target, perturb=perturb, speed=speeds)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def training_speed(model: str, batch: int, repeats: int) -> float:
    return batch / median_time(training_step(model, batch), repeats)


def twin_speedups(batch: int, repeats: int) -> list[dict[str, float]]:
    """NSAC samples/s with twins for a share of the batch, each paired step by step with all twins."""
    rows = []
    for fraction in TWIN_FRACTIONS:
        full, part, ratio = paired_median_ratio(training_step("nsac", batch), training_step("nsac", batch, fraction), repeats)
        rows.append({"twin_fraction": fraction, "all_twins_samples_per_s": batch / full,
                     "samples_per_s": batch / part, "speedup": 1 / ratio})
    return rows


def front_camera_step(repeats: int, cores: int) -> dict[str, float]:
    """Seconds per front-camera training step (batch 32): channels-last frames against the default
    layout on one thread, then channels-last on one thread against ``cores`` threads (what
    ``nsacdrive train`` uses on its own); steps alternated pair by pair."""
    front = recipe(FRONT_CAMERA_CONFIG)
    config, batch, twins = front.model, front.batch_size, front.twin_fraction
    default, channels_last, ratio = paired_median_ratio(training_step(config, batch, twins, channels_last=False),
                                                        training_step(config, batch, twins, channels_last=True), repeats)
    step = training_step(config, batch, twins, channels_last=True)

    def on(threads: int) -> Callable[[], None]:
        def run() -> None:
            torch.set_num_threads(threads)
            step()
        return run

    try:
        _, all_cores, _ = paired_median_ratio(on(1), on(cores), repeats)
    finally:
        torch.set_num_threads(1)
    return {"batch": batch, "default_layout_s": default, "channels_last_s": channels_last, "speedup": 1 / ratio,
            "cores": cores, "channels_last_all_cores_s": all_cores}


def control_latency(model: str, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    config = ModelConfig(model=model)
    controller = build_controller(config).eval()
    raw = np.random.default_rng(0).integers(0, 255, (4, 96, 96, 3), dtype=np.uint8)
    timestamps = torch.tensor([[-0.12, -0.08, -0.04, 0.0]])

    def control(samples: int):
        def run() -> None:
            controller.predict(torch.from_numpy(preprocess_observation(raw))[None], timestamps, samples=samples)
        return run

    return {"deterministic_ms": median_time(control(1), repeats) * 1e3,
            "uncertainty_ms": median_time(control(config.predict_samples), repeats) * 1e3,
            "samples": config.predict_samples}


def demo_training_memory() -> float | None:
    data = ROOT / "data" / "demo"
    if not data.is_dir():
        return None
    settings = json.loads((ROOT / "configs" / "demo.json").read_text())
    settings.update(epochs=1)
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(settings))
        process = subprocess.Popen([sys.executable, "-m", "nsacdrive.cli", "train", "--data", str(data), "--out",
                                    str(Path(folder) / "run"), "--config", str(config)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        with PeakRss(process.pid) as rss:
            process.wait()
    return rss.peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no memory run")
    args = parser.parse_args()
    cores = torch.get_num_threads()  # torch's default: one thread per core
    torch.set_num_threads(1)
    repeats = 2 if args.quick else 5
    rows = []
    for model in MODELS:
        latency = control_latency(model, 5 if args.quick else 30)
        rows.append({"model": model, "train_samples_per_s": training_speed(model, 64, repeats), **latency})
    print(f"\n{'model':<12}{'train samples/s':>17}{'control ms (det.)':>19}{'control ms (unc.)':>19}{'draws':>7}")
    for r in rows:
        print(f"{r['model']:<12}{r['train_samples_per_s']:>17.0f}{r['deterministic_ms']:>19.2f}{r['uncertainty_ms']:>19.2f}{r['samples']:>7}")
    twins = twin_speedups(64, repeats + 2)
    print(f"\nNSAC twins for part of each batch (batch 64, steps alternated with all twins; target ≥ {TWIN_TARGET:.0f}×)")
    print(f"{'twin_fraction':<15}{'all twins samples/s':>21}{'samples/s':>11}{'speedup':>9}")
    for r in twins:
        print(f"{r['twin_fraction']:<15}{r['all_twins_samples_per_s']:>21.0f}{r['samples_per_s']:>11.0f}{r['speedup']:>8.2f}×")
    front = front_camera_step(repeats + 2, cores)
    print(f"\nfront-camera training step (configs/front-camera.json, batch {front['batch']}; target ≤ {FRONT_CAMERA_TARGET_S} s): "
          f"{front['channels_last_s']:.2f} s channels-last, {front['default_layout_s']:.2f} s default layout "
          f"({front['speedup']:.2f}×) on one thread; channels-last on {cores} threads {front['channels_last_all_cores_s']:.2f} s")
    memory = None if args.quick else demo_training_memory()
    if memory is not None:
        print(f"\npeak resident memory of the demo training (1 epoch): {memory:.0f} MB")
    save_results("training_speed", args.quick, {"models": rows, "nsac_twins": twins, "front_camera_step": front, "demo_training_peak_rss_mb": memory})


if __name__ == "__main__":
    main()
