"""The training data path: 4-frame sequences per second out of a dataset, side by side in one run.

* per-sample raw path — what every sample cost before the frame store: each episode decoded into
  an LRU cache, each sample's frames gathered and encoded on its own (forced here with a
  corruption that changes nothing);
* frame store, first epoch — batches gathered whole (``__getitems__``), each episode decoded
  once and written as a memory-mapped uint8 file;
* frame store, later epochs — the files are mapped: one fancy-index copy per episode in a batch.
  Target: ≥ 20,000 samples/s, so an accelerator is not starved;
* scaling the uint8 batch to float32 on the CPU, for reference (on an accelerator it happens there).

Batches of 64 from :class:`EpisodeGroupedSampler`, one process, one torch thread; peak anonymous
memory (the page cache holding mapped files is the operating system's). Usage:
``python -m bench.data_pipeline [--quick]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from bench.common import print_table, save_results
from nsacdrive.data_collection.dataset import EpisodeGroupedSampler, SequenceDataset, batch_loader, network_frames
from nsacdrive.data_collection.episode import write_episode

TARGET_SAMPLES_PER_S = 20_000


def write_dataset(folder: Path, episodes: int, steps: int) -> None:
    """Episodes of real size whose frames differ step to step (a moving textured pattern), so the
    deflate stream costs what a recording's does."""
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 255, size=(96, 192, 3), dtype=np.uint8)
    for episode in range(episodes):
        observations = np.stack([np.roll(texture, -step, axis=1)[:, :96] for step in range(steps + 1)])
        zeros = {name: np.zeros(steps + extra, np.float32) for name, extra in
                 (("rewards", 0), ("speed", 1), ("lateral_error", 1), ("heading_error", 1), ("progress", 1))}
        arrays = dict(observations=observations, actions=rng.uniform(-1, 1, (steps, 3)).astype(np.float32),
                      expert_actions=rng.uniform(-1, 1, (steps, 3)).astype(np.float32), terminations=np.zeros(steps, bool),
                      truncations=np.zeros(steps, bool), pose=np.zeros((steps + 1, 3), np.float32),
                      state=np.zeros((steps + 1, 16), np.float32), **zeros)
        write_episode(folder, f"ep{episode:03d}", arrays, dict(track_seed=episode, colour_preset="default", colour_scheme={},
                                                                source="expert", agent={}))


def unchanged(frame: np.ndarray, seed: int, step: int) -> np.ndarray:
    return frame


def epoch_rate(dataset: SequenceDataset, epoch: int, max_batches: int | None = None) -> tuple[float, int]:
    """Samples/s of one pass over ``dataset`` in batches of 64 (at most ``max_batches``), and the
    peak anonymous memory in MB."""
    process = psutil.Process()
    sampler = EpisodeGroupedSampler(dataset, seed=0)
    sampler.set_epoch(epoch)
    samples, peak = 0, 0
    start = time.perf_counter()
    for index, batch in enumerate(batch_loader(dataset, 64, sampler)):
        samples += len(batch["step"])
        if index % 20 == 0:
            info = process.memory_info()
            peak = max(peak, info.rss - info.shared)
        if max_batches is not None and index + 1 >= max_batches:
            break
    return samples / (time.perf_counter() - start), peak // 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    episodes, steps = (6, 300) if args.quick else (40, 1000)
    with tempfile.TemporaryDirectory() as folder:
        write_dataset(Path(folder), episodes, steps)
        raw = SequenceDataset(folder, sequence_length=4, cache_episodes=4, corruption=unchanged)
        raw_rate, raw_peak = epoch_rate(raw, 0, max_batches=60 if args.quick else 300)
        stored = SequenceDataset(folder, sequence_length=4)
        first_rate, first_peak = epoch_rate(stored, 0)
        later_rate, later_peak = epoch_rate(stored, 1)
        batch = next(iter(batch_loader(stored, 64)))
        start, repeats = time.perf_counter(), 50
        for _ in range(repeats):
            network_frames(batch["frames"], stored.kind)
        scale_rate = repeats * 64 / (time.perf_counter() - start)
        samples = len(stored)
    result = {"episodes": episodes, "steps": steps, "samples": samples, "raw_per_sample": raw_rate, "store_first_epoch": first_rate,
              "store_later_epochs": later_rate, "scale_to_float_cpu": scale_rate, "peak_anonymous_mb":
              {"raw": raw_peak, "store_first": first_peak, "store_later": later_peak}, "target": TARGET_SAMPLES_PER_S}
    verdict = "met" if later_rate >= TARGET_SAMPLES_PER_S else "not met"
    rows = [
        (f"dataset: {episodes} episodes × {steps} steps, T = 4, batch 64, 1 thread", f"{samples} samples"),
        ("per-sample raw path (decode into an LRU cache, encode per sample)", f"{raw_rate:,.0f} samples/s (peak {raw_peak} MB)"),
        ("frame store, first epoch (decodes and writes each episode once)", f"{first_rate:,.0f} samples/s (peak {first_peak} MB)"),
        (f"frame store, later epochs (target ≥ {TARGET_SAMPLES_PER_S:,})", f"{later_rate:,.0f} samples/s (peak {later_peak} MB): {verdict}"),
        ("  later epochs / per-sample raw path", f"{later_rate / raw_rate:.1f}×"),
        ("uint8 → float32 scaling on the CPU (on an accelerator: there)", f"{scale_rate:,.0f} samples/s"),
    ]
    print_table("training data pipeline", rows)
    save_results("data-pipeline", args.quick, result)


if __name__ == "__main__":
    main()
