"""Fast vs stock CarRacing renderer: env throughput and pixel fidelity, printed as one table.

Speed: the same 600 expert actions replayed through gymnasium's registry (``nsacdrive/CarRacing-v3``)
in a stock-renderer env, a fast-renderer env and a render-free env (one core). The fast and
render-free replays alternate, several times, each in a fresh env: the pixel env's share of
render-free physics is the median of the paired ratios (target: ≥ 40 %), so a load
spike on a shared machine lands on both sides of a pair. Then where a pixel env step's time goes, part
by part (:func:`render_phases`), next to the time the frame may take for the target to be met.
Fidelity: expert episodes on 20 track seeds cycling through several colour presets; at every
sampled step BOTH renderers draw the SAME env state (so HUD, score and zoom-in agree exactly),
and we report the mean absolute pixel difference (0–255 scale), the 99th percentile of
per-frame means, the worst frame, and PSNR, over ≥ 2,000 frames including the zoom-in.

Usage: ``python -m bench.renderer [--quick]`` (part of ``make bench``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from gymnasium.envs.box2d.car_racing import CarRacing  # noqa: E402

from bench.common import paired_rates, print_table, replay_rate, replay_seconds, timed_calls  # noqa: E402
from nsacdrive.agents.expert import PurePursuitExpert  # noqa: E402
from nsacdrive.agents.rollout import drive  # noqa: E402
from nsacdrive.common.atomic import atomic_write_json  # noqa: E402
from nsacdrive.envs.car_racing import make_car_racing  # noqa: E402
from nsacdrive.envs.fast_render import FastStateRenderer  # noqa: E402
from nsacdrive.envs.track_raster import TrackRaster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

FIDELITY_PRESETS = ("default", "shift-3", "random", "color-v0", "shift-5")


PIXEL_SHARE_TARGET = 0.40  # the pixel env at ≥ 40 % of render-free physics steps/s
FIDELITY_TARGET = 1.0  # mean |fast − stock| ≤ 1/255 after the zoom-in


def replay_speed(actions: list[np.ndarray], seed: int, pairs: int) -> dict[str, float]:
    """Steps/s of each renderer replaying ``actions``; fast and render-free alternate ``pairs`` times."""
    paired = paired_rates(lambda: replay_rate(actions, seed, renderer="fast"),
                          lambda: replay_rate(actions, seed, render_observations=False), pairs)
    out = {
        "stock": replay_rate(actions, seed, renderer="stock"),
        "fast": paired["pixel"],
        "render_free": paired["render_free"],
        "fast_share_of_render_free": paired["share"],
        "fast_share_range": paired["share_range"],
        "pairs": pairs,
    }
    out["fast_over_stock"] = out["fast"] / out["stock"]
    return out


#: the fast renderer's parts, timed in place: (name, owner, attribute); "raster cut" holds the chunks
#: it draws on first reach and "whole frame" holds every other part (both are split out below)
RENDER_PHASES = (("whole frame", FastStateRenderer, "render"), ("zoom-in scene (polygons)", FastStateRenderer, "_scene_from_polygons"),
                 ("tile repaints", TrackRaster, "refresh"), ("raster cut", TrackRaster, "sample"),
                 ("raster chunks drawn", TrackRaster, "_build"), ("car", FastStateRenderer, "_draw_car"),
                 ("HUD", FastStateRenderer, "_draw_hud"))


def render_phases(actions: list[np.ndarray], seed: int, render_free: float) -> dict[str, float]:
    """Microseconds per env step of each part of the fast renderer while replaying ``actions`` from
    reset (zoom-in and first chunk drawing included, as in :func:`replay_speed`; after one untimed
    replay, as its alternating replays are), the env beyond the frame (physics and bookkeeping), and
    the frame's budget: the most it may take for the pixel env to reach :data:`PIXEL_SHARE_TARGET` of
    ``render_free`` steps/s with the env beyond the frame as measured. Timers add ~1 µs a call."""
    replay_rate(actions, seed, renderer="fast")
    env = make_car_racing(max_episode_steps=len(actions) + 1, renderer="fast")
    env.reset(seed=seed)
    with timed_calls(RENDER_PHASES) as spent:
        pixel_step = 1e6 * replay_seconds(env, actions) / len(actions)
    env.close()
    per_step = {name: 1e6 * spent[name] / len(actions) for name, _, _ in RENDER_PHASES}
    frame = per_step.pop("whole frame")
    per_step["raster cut"] -= per_step["raster chunks drawn"]
    per_step["rest of the frame (camera, level table, buffers)"] = frame - sum(per_step.values())
    per_step["env beyond the frame (physics, bookkeeping)"] = pixel_step - frame
    per_step["pixel env step"] = pixel_step
    budget = 1e6 / (PIXEL_SHARE_TARGET * render_free) - (pixel_step - frame)
    return {**per_step, "frame": frame, "frame_budget": budget}


def fidelity(seeds: list[int], frames_per_seed: int) -> dict[str, float]:
    per_frame_mae, squared_errors, intro_mae, after_mae = [], [], [], []
    for i, seed in enumerate(seeds):
        preset = FIDELITY_PRESETS[i % len(FIDELITY_PRESETS)]
        env = make_car_racing(colour_preset=preset, render_observations=False, renderer="fast")
        base = env.unwrapped
        n_steps = sum(1 for _ in drive(env, PurePursuitExpert(), seed=seed))  # render-free: cheap
        # sample the zoom-in (every 5th of the first 50 steps) and evenly over the rest of the lap
        wanted = set(range(0, 50, 5)) | set(np.linspace(50, n_steps - 1, frames_per_seed - 10, dtype=int).tolist())
        for t, _ in enumerate(drive(env, PurePursuitExpert(), seed=seed)):  # the same drive again
            if t in wanted:
                fast = base.render_observation().astype(np.float64)
                stock = CarRacing._render(base, "state_pixels").astype(np.float64)
                error = np.abs(fast - stock)
                per_frame_mae.append(error.mean())
                squared_errors.append((error**2).mean())
                (intro_mae if t < 50 else after_mae).append(error.mean())
        env.close()
    mae = np.array(per_frame_mae)
    mse = float(np.mean(squared_errors))
    return {
        "frames": len(mae),
        "mae_mean": float(mae.mean()),
        "mae_p99": float(np.percentile(mae, 99)),
        "mae_max": float(mae.max()),
        "mae_zoom_in": float(np.mean(intro_mae)),
        "mae_after_zoom_in": float(np.mean(after_mae)),
        "psnr_db": float(10 * np.log10(255.0**2 / mse)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    steps = 200 if args.quick else 600
    env = make_car_racing(render_observations=False, max_episode_steps=steps)
    actions = [step.executed for step in drive(env, PurePursuitExpert(), seed=0)]
    speed = replay_speed(actions, seed=0, pairs=3 if args.quick else 9)
    phases = render_phases(actions, seed=0, render_free=speed["render_free"])
    seeds = list(range(2000, 2004 if args.quick else 2020))
    fid = fidelity(seeds, frames_per_seed=25 if args.quick else 110)
    rows = [
        ("env steps/s, stock renderer (1 core)", f"{speed['stock']:.0f}"),
        ("env steps/s, fast renderer (1 core)", f"{speed['fast']:.0f}"),
        ("  fast / stock", f"{speed['fast_over_stock']:.1f}×"),
        ("env steps/s, render-free physics", f"{speed['render_free']:.0f}"),
        (f"  fast / render-free (median of {speed['pairs']} pairs; target ≥ {PIXEL_SHARE_TARGET:.0%})",
         f"{speed['fast_share_of_render_free']:.0%} (pairs {speed['fast_share_range'][0]:.0%}–{speed['fast_share_range'][1]:.0%}): "
         + ("met" if speed["fast_share_of_render_free"] >= PIXEL_SHARE_TARGET else "not met")),
        (f"  where a pixel env step goes over {len(actions)} steps from reset (µs per step)",
         ", ".join(f"{name} {value:.0f}" for name, value in phases.items() if name not in ("frame", "frame_budget"))),
        (f"  the frame: measured | its budget for {PIXEL_SHARE_TARGET:.0%} (render-free's rate and the env beyond the frame as measured)",
         f"{phases['frame']:.0f} | {phases['frame_budget']:.0f} µs per step"),
        (f"fidelity frames ({len(seeds)} seeds, presets {', '.join(FIDELITY_PRESETS)})", f"{fid['frames']}"),
        ("mean |fast − stock| (0–255)", f"{fid['mae_mean']:.3f}"),
        ("99th percentile of per-frame means", f"{fid['mae_p99']:.3f}"),
        ("worst frame mean", f"{fid['mae_max']:.3f}"),
        ("mean during zoom-in (first 50 steps)", f"{fid['mae_zoom_in']:.3f}"),
        (f"mean after the zoom-in (target ≤ {FIDELITY_TARGET:.0f})",
         f"{fid['mae_after_zoom_in']:.3f}: " + ("met" if fid["mae_after_zoom_in"] <= FIDELITY_TARGET else "not met")),
        ("PSNR", f"{fid['psnr_db']:.1f} dB"),
    ]
    print_table("renderer benchmark", rows)
    out = ROOT / "bench" / "results" / ("renderer-quick.json" if args.quick else "renderer.json")
    atomic_write_json(out, {"speed": speed, "render_phases_us_per_step": phases, "fidelity": fid, "seeds": seeds,
                            "presets": FIDELITY_PRESETS})
    print(f"\nsaved → {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
