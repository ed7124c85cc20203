"""Foundation benchmarks, printed as one table (and saved to bench/results/foundation.json).

1. env steps/s: stock pixel drawing vs render-free, same expert actions, one core, one run;
2. collection throughput (``nsacdrive collect``, default fast renderer, expert agent) with 1 and
   2 workers and the peak resident memory of the whole process tree (sampled with psutil);
   worker start-up (spawn, imports) is included, as a user would see it;
3. dataset memory: one epoch over a 50-episode × 1000-frame dataset through a DataLoader (it builds
   the frame store: every episode decoded once; ``bench/data_pipeline.py`` times the later epochs);
4. expert quality on the held-out seeds 1000–1099.

Usage: ``python -m bench.run [--quick]`` (``make bench``). Speeds on shared machines are noisy:
compare the ratios printed side by side, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from bench.common import NSACDRIVE, PeakRss, print_table, replay_rate  # noqa: E402
from nsacdrive.agents.expert import PurePursuitExpert  # noqa: E402
from nsacdrive.agents.quality import evaluate_agent  # noqa: E402
from nsacdrive.agents.rollout import drive  # noqa: E402
from nsacdrive.common.atomic import atomic_write_json  # noqa: E402
from nsacdrive.envs.car_racing import make_car_racing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def env_speed(steps: int) -> dict[str, float]:
    """Env steps/s replaying the same expert actions with and without pixel drawing, plus the
    render-free speed with the expert (privileged state + planning) in the loop."""
    env = make_car_racing(render_observations=False, max_episode_steps=steps)
    start = time.perf_counter()
    actions = [step.executed for step in drive(env, PurePursuitExpert(), seed=0)]
    out = {"render_free_with_expert": len(actions) / (time.perf_counter() - start)}
    out["pixels"] = replay_rate(actions, 0, render_observations=True)
    out["render_free"] = replay_rate(actions, 0, render_observations=False)
    out["ratio"] = out["render_free"] / out["pixels"]
    return out


def collection(workers: int, episodes: int, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        command = [*NSACDRIVE, "collect", "--seeds", f"0-{episodes - 1}", "--max-steps", str(steps), "--workers", str(workers),
                   "--out", folder]
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with PeakRss(process.pid) as rss:
            if process.wait() != 0:
                raise RuntimeError(f"collection failed: {' '.join(command)}")
        seconds = time.perf_counter() - start
    return {"workers": workers, "steps_per_s": episodes * steps / seconds, "peak_rss_mb": rss.peak / 2**20}


def dataset_memory(episodes: int, frames: int) -> dict[str, float]:
    """Peak RSS while iterating a synthetic dataset of real-sized episodes in a child process."""
    code = f"""
import numpy as np, torch, sys
torch.set_num_threads(1)  # batch collation is memory-bound; extra threads only spin on 2 cores
from nsacdrive.data_collection.episode import write_episode
from nsacdrive.data_collection.dataset import SequenceDataset, EpisodeGroupedSampler, batch_loader
folder = sys.argv[1]
rng = np.random.default_rng(0)
base = rng.integers(0, 255, size=(96, 96, 3), dtype=np.uint8)
for e in range({episodes}):
    T = {frames}
    obs = np.repeat(base[None], T + 1, axis=0); obs[:, :8, :8] = (np.arange(T + 1) % 256)[:, None, None, None]
    arrays = dict(observations=obs, actions=np.zeros((T, 3), np.float32), expert_actions=np.zeros((T, 3), np.float32),
        rewards=np.zeros(T, np.float32), terminations=np.zeros(T, bool), truncations=np.zeros(T, bool),
        pose=np.zeros((T + 1, 3), np.float32), speed=np.zeros(T + 1, np.float32), lateral_error=np.zeros(T + 1, np.float32),
        heading_error=np.zeros(T + 1, np.float32), progress=np.zeros(T + 1, np.float32), state=np.zeros((T + 1, 16), np.float32))
    write_episode(folder, f"ep{{e:03d}}", arrays, dict(track_seed=e, colour_preset="default", colour_scheme={{}}, source="expert", agent={{}}))
print("ready", flush=True)
sys.stdin.readline()
ds = SequenceDataset(folder, sequence_length=4, cache_episodes=4)
loader = batch_loader(ds, 64, EpisodeGroupedSampler(ds, seed=0))
n = sum(len(batch["action"]) for batch in loader)
print(n, flush=True)
"""
    with tempfile.TemporaryDirectory() as folder:
        process = subprocess.Popen([sys.executable, "-c", code, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "ready"
        with PeakRss(process.pid) as rss:
            start = time.perf_counter()
            process.stdin.write("go\n")
            process.stdin.flush()
            samples = int(process.stdout.readline())
            process.wait()
        seconds = time.perf_counter() - start
    return {"episodes": episodes, "samples": samples, "samples_per_s": samples / seconds, "peak_rss_mb": rss.peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, not for the record)")
    args = parser.parse_args()
    quick = args.quick
    results: dict[str, object] = {}

    speed = env_speed(steps=150 if quick else 600)
    results["env_speed"] = speed
    collect_eps, collect_steps = (2, 100) if quick else (6, 600)
    results["collection"] = [collection(w, collect_eps, collect_steps) for w in (1, 2)]
    results["dataset"] = dataset_memory(episodes=6 if quick else 50, frames=200 if quick else 1000)
    seeds = list(range(1000, 1010 if quick else 1100))
    quality = evaluate_agent("expert", seeds, workers=2).aggregate()
    results["expert_quality"] = {"seeds": f"{seeds[0]}-{seeds[-1]}", **quality}

    c1, c2 = results["collection"]
    ds = results["dataset"]
    rows = [
        ("env steps/s, stock pixels (1 core)", f"{speed['pixels']:.0f}"),
        ("env steps/s, render-free (1 core)", f"{speed['render_free']:.0f}"),
        ("  render-free / pixels", f"{speed['ratio']:.1f}×"),
        ("render-free steps/s with expert in the loop", f"{speed['render_free_with_expert']:.0f}"),
        ("collection steps/s, 1 worker (fast renderer)", f"{c1['steps_per_s']:.0f}  (peak RSS {c1['peak_rss_mb']:.0f} MB)"),
        ("collection steps/s, 2 workers (fast renderer)", f"{c2['steps_per_s']:.0f}  (peak RSS {c2['peak_rss_mb']:.0f} MB)"),
        ("  2 workers / 1 worker", f"{c2['steps_per_s'] / c1['steps_per_s']:.2f}×"),
        (f"dataset, first epoch (builds the frame store), {ds['episodes']} episodes", f"{ds['samples_per_s']:.0f} samples/s, peak RSS {ds['peak_rss_mb']:.0f} MB"),
        (f"expert score, seeds {seeds[0]}-{seeds[-1]}",
         f"{quality['score_mean']:.1f} ± {quality['score_std']:.1f} (min {quality['score_min']:.1f})"),
        ("expert lap finished", f"{100 * quality['lap_finished_rate']:.0f}%"),
        ("expert mean |lateral error|", f"{quality['mean_abs_lateral_error']:.2f} units"),
    ]
    print_table("benchmark", rows)
    out = ROOT / "bench" / "results" / ("foundation-quick.json" if quick else "foundation.json")
    atomic_write_json(out, results)
    print(f"\nsaved → {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
