"""Front-camera simulator speed: frames/s of the Udacity-style camera vs the fast CarRacing renderer.

The expert drives a track render-free; at sampled steps the SAME state is drawn by the front
camera (centre only, and all three cameras) and by the fast 96×96 CarRacing renderer, each
timed on one core. Env throughput (physics + drawing per step) is measured by replaying the
expert's actions in each env; the centre-camera env and the same env render-free alternate, and
the median of their paired ratios is the pixel-env share for the front camera (≥ 40 %).

Usage: ``python -m bench.front_camera [--quick]`` (part of ``make bench``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from bench.common import paired_rates, print_table, replay_rate  # noqa: E402
from bench.renderer import PIXEL_SHARE_TARGET  # noqa: E402
from nsacdrive.agents.expert import PurePursuitExpert  # noqa: E402
from nsacdrive.agents.rollout import drive  # noqa: E402
from nsacdrive.common.atomic import atomic_write_json  # noqa: E402
from nsacdrive.envs.fast_render import FastStateRenderer  # noqa: E402
from nsacdrive.envs.udacity_style import CAMERAS, make_udacity_style  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def draw_rates(seeds: list[int], steps: int, every: int) -> dict[str, float]:
    """Frames/s of each renderer on the same expert states (every ``every``-th step of each seed)."""
    seconds = {"front_1": 0.0, "front_3": 0.0, "carracing_fast": 0.0}
    frames = 0
    fast = FastStateRenderer()
    for seed in seeds:
        env = make_udacity_style(render_observations=False, max_episode_steps=steps)
        base = env.unwrapped
        for t, _ in enumerate(drive(env, PurePursuitExpert(), seed=seed)):
            if t % every:
                continue
            start = time.perf_counter()
            base.render_camera("center")
            middle = time.perf_counter()
            for name in CAMERAS:
                base.render_camera(name)
            end = time.perf_counter()
            fast.render(base)
            seconds["front_1"] += middle - start
            seconds["front_3"] += end - middle
            seconds["carracing_fast"] += time.perf_counter() - end
            frames += 1
        env.close()
    return {"frames": frames, **{name: frames / total for name, total in seconds.items()}}


def env_rates(steps: int, pairs: int) -> dict[str, object]:
    """Env steps/s replaying the same expert actions: the front-camera env (centre camera) and the
    same env render-free alternate ``pairs`` times, the camera env's share of render-free being
    the pixel-env ratio for the front camera (target as CarRacing's); the env with side
    cameras and CarRacing with its fast renderer once each."""
    env = make_udacity_style(render_observations=False, max_episode_steps=steps)
    actions = [step.executed for step in drive(env, PurePursuitExpert(), seed=0)]
    env.close()
    paired = paired_rates(lambda: replay_rate(actions, 0, make_env=make_udacity_style),
                          lambda: replay_rate(actions, 0, make_env=make_udacity_style, render_observations=False), pairs)
    return {"udacity_style": paired["pixel"], "render_free": paired["render_free"],
            "udacity_style_share_of_render_free": paired["share"], "share_range": paired["share_range"], "pairs": pairs,
            "udacity_style_side": replay_rate(actions, 0, make_env=make_udacity_style, side_cameras=True),
            "carracing_fast": replay_rate(actions, 0, renderer="fast")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    steps = 200 if args.quick else 800
    seeds = [0, 1] if args.quick else [0, 1, 2, 3, 4]
    draw = draw_rates(seeds, steps, every=2)
    env = env_rates(steps, pairs=3 if args.quick else 7)
    share, (low, high) = env["udacity_style_share_of_render_free"], env["share_range"]
    rows = [
        (f"draw frames/s, one core ({draw['frames']} expert states, seeds {seeds[0]}-{seeds[-1]})", ""),
        ("  front camera 320×160, centre only", f"{draw['front_1']:.0f}"),
        ("  front camera 320×160, 3 cameras (sets/s)", f"{draw['front_3']:.0f}  ({3 * draw['front_3']:.0f} frames/s)"),
        ("  CarRacing fast renderer 96×96", f"{draw['carracing_fast']:.0f}"),
        ("env steps/s, one core (physics + drawing)", ""),
        ("  udacity-style, centre camera", f"{env['udacity_style']:.0f}"),
        ("  udacity-style, + side cameras", f"{env['udacity_style_side']:.0f}"),
        ("  udacity-style, render-free", f"{env['render_free']:.0f}"),
        (f"  centre camera / render-free (median of {env['pairs']} pairs; target ≥ {PIXEL_SHARE_TARGET:.0%})",
         f"{share:.0%} (pairs {low:.0%}–{high:.0%}): " + ("met" if share >= PIXEL_SHARE_TARGET else "not met")),
        ("  carracing, fast renderer", f"{env['carracing_fast']:.0f}"),
    ]
    print_table("front-camera benchmark", rows)
    out = ROOT / "bench" / "results" / ("front-camera-quick.json" if args.quick else "front-camera.json")
    atomic_write_json(out, {"draw": draw, "env": env, "seeds": seeds, "steps": steps})
    print(f"\nsaved → {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
