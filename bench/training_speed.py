"""Controller speed: training samples/s per model and one-frame control latency.

* training: samples/s of one optimiser step (the uint8 batch scaled as the trainer does, loss
  incl. MC draws and perturbed passes, backward, AdamW) at batch 64 on T = 4 frames, per model
  (:func:`bench.common.training_step`, which ``bench.accelerator`` times on a GPU too);
* control: latency of ``ControllerAgent``-style prediction for one new frame (preprocess +
  encoder over the T-frame window + head), deterministic (1 draw) vs with uncertainty
  (the model's own number of draws, batched inside the head). Target: ≤ 10 ms per step;
* NSAC training, before the throughput work against now: samples/s of the demo recipe's model at batch 64
  with perturbed twins for the whole batch and glibc's default heap (before) and with the recipe's
  twin fraction and freed memory kept (``nsacdrive.common.heap``; now), plus each change alone,
  the recipe's earlier quarter of twins, and now with the encoder's convolutions in bfloat16
  (``precision: bfloat16``, fast on CPUs with AMX tiles); every variant in its own process (the heap
  setting is process-wide), variants alternated round by round (target: ≥ 2×);
* the front-camera step: seconds per batch of 32 of ``configs/front-camera.json``'s model (NVIDIA
  encoder on 66×200 YUV frames, twins for a quarter), the encoder fed channels-last frames (what
  it does) against the default layout, steps alternated, and on one thread against all cores;
  then the whole step of a real ``nsacdrive train`` on freshly recorded front-camera episodes (its
  batches gathered and augmented as the trainer does, all cores; target: ≤ 0.3 s);
* memory: peak resident memory of the demo training (``configs/demo.json``, one epoch, on
  ``data/demo`` when present), sampled with psutil. Target: ≤ 4 GB.

One thread (torch.set_num_threads(1)): "per step on one core", except the front-camera step's
all-cores row. Usage:
``python -m bench.training_speed [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common import (
    NSACDRIVE,
    PeakRss,
    median_time,
    model_recipe,
    paired_median_ratio,
    recipe,
    recipe_timestamps,
    save_results,
    training_step,
)
from nsacdrive.common.heap import keep_freed_memory
from nsacdrive.controllers.precision import cpu_has_amx_tiles
from nsacdrive.controllers.registry import MODEL_BUILDERS, build_controller
from nsacdrive.envs.observation import preprocess_observation

ROOT = Path(__file__).resolve().parents[1]

MODELS = sorted(set(MODEL_BUILDERS) | {"ensemble"})
TRAINING_SPEEDUP_TARGET = 2.0


DEMO_CONFIG = ROOT / "configs" / "demo.json"
FRONT_CAMERA_CONFIG = ROOT / "configs" / "front-camera.json"
FRONT_CAMERA_TARGET_S = 0.3


def training_speed(model: str, batch: int, repeats: int) -> float:
    return batch / median_time(training_step(model_recipe(model), batch), repeats)


#: (twin fraction, keep freed memory, the encoder's precision; None: the demo recipe's fraction):
#: before the throughput work, each change alone, the recipe now, the recipe's earlier quarter, and now in bfloat16
NSAC_VARIANTS = {"before": (1.0, False, "float32"), "twins": (None, False, "float32"), "heap": (1.0, True, "float32"),
                 "now": (None, True, "float32"), "quarter": (0.25, True, "float32"), "bfloat16": (None, True, "bfloat16")}


def nsac_step_rate(twin_fraction: float, keep_memory: bool, precision: str, repeats: int) -> float:
    """Samples/s of the demo recipe's NSAC step at batch 64 (this process: call it in a fresh one)."""
    if keep_memory:
        keep_freed_memory()
    config = dataclasses.replace(recipe(DEMO_CONFIG), precision=precision)
    return 64 / median_time(training_step(config, 64, twin_fraction=twin_fraction), repeats, warmup=3)


def nsac_before_and_now(rounds: int, repeats: int) -> dict[str, object]:
    """:data:`NSAC_VARIANTS` each in a fresh process, alternated round by round; the speedup of
    each round's "now" over its "before"."""
    recipe_twins = recipe(DEMO_CONFIG).twin_fraction
    rates: dict[str, list[float]] = {name: [] for name in NSAC_VARIANTS}
    for _ in range(rounds):
        for name, (fraction, keep, precision) in NSAC_VARIANTS.items():
            code = (f"from bench.training_speed import nsac_step_rate; import torch; torch.set_num_threads(1); "
                    f"print(nsac_step_rate({fraction or recipe_twins}, {keep}, {precision!r}, {repeats}))")
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
            rates[name].append(float(done.stdout.split()[-1]))

    def over_before(name: str) -> list[float]:
        return [rate / before for rate, before in zip(rates[name], rates["before"], strict=True)]

    speedups, bfloat16 = over_before("now"), over_before("bfloat16")
    return {"recipe_twin_fraction": recipe_twins, "variants": {name: list(value) for name, value in NSAC_VARIANTS.items()},
            "samples_per_s": rates, "median_samples_per_s": {name: float(np.median(r)) for name, r in rates.items()},
            "speedup": float(np.median(speedups)), "speedup_range": [min(speedups), max(speedups)],
            "bfloat16_speedup": float(np.median(bfloat16)), "bfloat16_speedup_range": [min(bfloat16), max(bfloat16)],
            "amx": cpu_has_amx_tiles()}


def front_camera_step(repeats: int, cores: int) -> dict[str, float]:
    """Seconds per front-camera training step (batch 32): channels-last frames against the default
    layout on one thread, then channels-last on one thread against ``cores`` threads (what
    ``nsacdrive train`` uses on its own); steps alternated pair by pair."""
    front = recipe(FRONT_CAMERA_CONFIG)
    batch = front.batch_size
    default, channels_last, ratio = paired_median_ratio(training_step(front, batch, channels_last=False),
                                                        training_step(front, batch, channels_last=True), repeats)
    step = training_step(front, batch, channels_last=True)

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


def front_camera_whole_step(episodes: int, steps: int, batches: int, device: str = "cpu") -> dict[str, object]:
    """Seconds per step of a real ``nsacdrive train --config configs/front-camera.json --device DEVICE``
    (all cores, its batches gathered and augmented as the trainer does), on front-camera episodes recorded first
    (the expert, three cameras); from the run's history: epoch 1 decodes each episode once, epoch 2
    is the steady state."""
    with tempfile.TemporaryDirectory() as folder:
        data, run = Path(folder) / "data", Path(folder) / "run"
        for command in (["collect", "--env", "udacity-style", "--seeds", f"0-{episodes - 1}", "--max-steps", str(steps),
                         "--workers", "2", "--out", str(data)],
                        ["train", "--config", str(FRONT_CAMERA_CONFIG), "--data", str(data), "--epochs", "2",
                         "--max-batches-per-epoch", str(batches), "--device", device, "--out", str(run)]):
            subprocess.run([*NSACDRIVE, *command], check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        history = json.loads((run / "history.json").read_text())
    return {"episodes": episodes, "steps": steps, "batches": batches, "device": device, "step_seconds": [epoch["step_seconds"] for epoch in history],
            "val_seconds": [epoch["val_seconds"] for epoch in history]}


def control_latency(model: str, repeats: int) -> dict[str, float]:
    """Milliseconds of one prediction of ``model`` (its default recipe) on one CarRacing sequence:
    one draw (deterministic) and the recipe's draws."""
    config = model_recipe(model)
    torch.manual_seed(0)
    controller = build_controller(config.model).eval()
    raw = np.random.default_rng(0).integers(0, 255, (config.sequence_length, 96, 96, 3), dtype=np.uint8)
    timestamps = recipe_timestamps(config, 1)

    def control(samples: int):
        def run() -> None:
            controller.predict(torch.from_numpy(preprocess_observation(raw))[None], timestamps, samples=samples)
        return run

    draws = config.model.predict_samples
    return {"deterministic_ms": median_time(control(1), repeats) * 1e3, "uncertainty_ms": median_time(control(draws), repeats) * 1e3,
            "samples": draws}


def demo_training_memory() -> float | None:
    data = ROOT / "data" / "demo"
    if not data.is_dir():
        return None
    settings = json.loads(DEMO_CONFIG.read_text())
    settings.update(epochs=1)
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(settings))
        process = subprocess.Popen([*NSACDRIVE, "train", "--data", str(data), "--out", str(Path(folder) / "run"),
                                    "--config", str(config)],
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
    keep_freed_memory()  # as the trainer does (the before/now comparison runs each variant in its own process)
    repeats = 2 if args.quick else 5
    rows = []
    for model in MODELS:
        latency = control_latency(model, 5 if args.quick else 30)
        rows.append({"model": model, "train_samples_per_s": training_speed(model, 64, repeats), **latency})
    print(f"\n{'model':<12}{'train samples/s':>17}{'control ms (det.)':>19}{'control ms (unc.)':>19}{'draws':>7}")
    for r in rows:
        print(f"{r['model']:<12}{r['train_samples_per_s']:>17.0f}{r['deterministic_ms']:>19.2f}{r['uncertainty_ms']:>19.2f}{r['samples']:>7}")
    nsac = nsac_before_and_now(2 if args.quick else 4, 4 if args.quick else 10)
    names = {"before": "all twins, glibc's default heap (before the throughput work)", "twins": f"twins for {nsac['recipe_twin_fraction']:g} (the demo recipe's)",
             "heap": "all twins, freed memory kept", "now": f"twins for {nsac['recipe_twin_fraction']:g}, freed memory kept (now)",
             "quarter": "twins for 0.25 (the earlier recipe), freed memory kept",
             "bfloat16": f"now, the encoder in bfloat16 (AMX tiles on this CPU: {'yes' if nsac['amx'] else 'no'})"}
    print("\nNSAC training, demo recipe's model, batch 64, one thread (each variant in its own process, rounds alternated)")
    for name, label in names.items():
        print(f"  {label:<58}{nsac['median_samples_per_s'][name]:>8.0f} samples/s")
    low, high = nsac["speedup_range"]
    print(f"  now / before: {nsac['speedup']:.2f}× (rounds {low:.2f}–{high:.2f}×); target ≥ {TRAINING_SPEEDUP_TARGET:.0f}×: "
          f"{'met' if nsac['speedup'] >= TRAINING_SPEEDUP_TARGET else 'not met'}")
    low, high = nsac["bfloat16_speedup_range"]
    print(f"  now in bfloat16 / before: {nsac['bfloat16_speedup']:.2f}× (rounds {low:.2f}–{high:.2f}×): "
          f"{'met' if nsac['bfloat16_speedup'] >= TRAINING_SPEEDUP_TARGET else 'not met'} by the opt-in `precision: bfloat16` "
          "(the recipes train in float32: docs/guide/train.md, Training precision)")
    front = front_camera_step(repeats + 2, cores)
    print(f"\nfront-camera training step (configs/front-camera.json, batch {front['batch']}; target ≤ {FRONT_CAMERA_TARGET_S} s): "
          f"{front['channels_last_s']:.2f} s channels-last, {front['default_layout_s']:.2f} s default layout "
          f"({front['speedup']:.2f}×) on one thread; channels-last on {cores} threads {front['channels_last_all_cores_s']:.2f} s")
    whole = front_camera_whole_step(4, 300, 15) if args.quick else front_camera_whole_step(6, 500, 40)
    first, steady = whole["step_seconds"]
    print(f"whole front-camera step of `nsacdrive train` ({whole['episodes']} recorded episodes, {whole['batches']} batches an epoch, "
          f"{cores} threads): {steady:.3f} s (first epoch {first:.3f} s); target ≤ {FRONT_CAMERA_TARGET_S} s: "
          f"{'met' if steady <= FRONT_CAMERA_TARGET_S else 'not met'}")
    memory = None if args.quick else demo_training_memory()
    if memory is not None:
        print(f"\npeak resident memory of the demo training (1 epoch): {memory:.0f} MB")
    save_results("training_speed", args.quick, {"models": rows, "nsac_before_and_now": nsac, "front_camera_step": front,
                                               "front_camera_whole_step": whole, "demo_training_peak_rss_mb": memory})


if __name__ == "__main__":
    main()
