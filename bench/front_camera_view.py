"""How much road the front camera saw when a closed-loop episode left the road, for several fields of view.

A front-camera controller can only steer back to a road it sees. For every failed episode of
closed-loop evaluations on ``nsacdrive/UdacityStyle-v0`` (``nsacdrive eval`` or ``dagger``
folders: ``episodes/*.json`` + ``*.npz``), this replays the episode's executed actions
(render-free: the physics is deterministic), stops ``--before`` steps before the first step with
|lateral error| > ``--lateral``, and draws the centre camera there with each ``--fov``: the share of
the frame's pixels in the road's colours. A share near zero means the frame no longer holds the
road, so no imitation of the expert's label could have recovered. Usage::

    python -m bench.front_camera_view runs/f30-dagger-s0/eval runs/f30-dagger-s1/eval --fov 65,90,120
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.envs.front_camera import CameraConfig, FrontCamera, FrontCameraPalette
from nsacdrive.envs.udacity_style import make_udacity_style
from nsacdrive.eval.results import load_episode, load_records

ROAD_COLOUR_TOLERANCE = 12.0  # RGB distance from a road shade still counted as road (anti-aliased edges)
OUT_OF_VIEW = 0.01  # road share of the frame below which the road counts as out of view


def failures(eval_folder: Path) -> list[dict[str, Any]]:
    """Records of the failed, uncorrupted episodes of one closed-loop evaluation folder that have a per-step log."""
    return [record for record in load_records(eval_folder)
            if not record["lap_finished"] and not record["failed"] and record["corruption"] == "none"]


def road_share(frame: np.ndarray, palette: FrontCameraPalette) -> float:
    """Share of the frame's pixels within ``ROAD_COLOUR_TOLERANCE`` of one of the road's shades."""
    pixels = frame.reshape(-1, 1, 3).astype(np.float32)
    shades = np.asarray(palette.road_shades, dtype=np.float32)[None]
    return float((np.linalg.norm(pixels - shades, axis=2).min(axis=1) <= ROAD_COLOUR_TOLERANCE).mean())


def view_at_failure(eval_folder: Path, record: dict[str, Any], cameras: dict[float, FrontCamera], lateral: float,
                    before: int) -> dict[float, float] | None:
    """Road share per field of view, ``before`` steps before the episode first left the road (None: it never did)."""
    _, log = load_episode(eval_folder, record["episode_id"])
    off_road = np.flatnonzero(np.abs(log["lateral_error"]) > lateral)
    actions = log["executed_action"]
    if off_road.size == 0:
        return None
    stop = max(int(off_road[0]) - before, 1)
    env = make_udacity_style(colour_preset=record["colour_preset"], render_observations=False, max_episode_steps=len(actions) + 1)
    try:
        env.reset(seed=record["track_seed"])
        for action in actions[:stop]:
            env.step(action)
        world = env.unwrapped
        palette = FrontCameraPalette.from_scheme(world.colour_scheme)
        return {fov: road_share(camera.render(world), palette) for fov, camera in cameras.items()}
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_folders", type=Path, nargs="+")
    parser.add_argument("--fov", default="65,90,120", help="horizontal fields of view, degrees (65: the simulator's)")
    parser.add_argument("--lateral", type=float, default=8.0, help="|lateral error| that counts as off the road")
    parser.add_argument("--before", type=int, default=0, help="steps before leaving the road at which to look")
    args = parser.parse_args()
    fovs = [float(f) for f in args.fov.split(",")]
    cameras = {fov: FrontCamera(CameraConfig(horizontal_fov=fov)) for fov in fovs}
    shares: dict[float, list[float]] = {fov: [] for fov in fovs}
    for folder in args.eval_folders:
        for record in failures(folder):
            view = view_at_failure(folder, record, cameras, args.lateral, args.before)
            if view is not None:
                for fov, share in view.items():
                    shares[fov].append(share)
    count = len(shares[fovs[0]])
    print(f"{count} failed episodes, camera drawn {args.before} steps before |lateral error| first exceeded {args.lateral}")
    print(f"{'FOV °':>6}{'median road share':>19}{f'road out of view (< {OUT_OF_VIEW:.0%})':>28}")
    for fov in fovs:
        values = np.asarray(shares[fov])
        print(f"{fov:>6.0f}{np.median(values):>19.3f}{(values < OUT_OF_VIEW).mean():>27.0%} ({int((values < OUT_OF_VIEW).sum())} of {count})")


if __name__ == "__main__":
    main()
