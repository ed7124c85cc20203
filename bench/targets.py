"""The throughput targets: each measured figure next to its target, met or not.

Reads what the other bench scripts saved under ``bench/results/`` (``make bench`` runs them first
and this last); a figure whose script has not run says so, and one read from a ``--quick`` run
is marked. Usage: ``python -m bench.targets``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.closed_loop_speed import EVALUATOR_TARGET
from bench.common import print_table
from bench.data_pipeline import TARGET_SAMPLES_PER_S
from bench.renderer import FIDELITY_TARGET, PIXEL_SHARE_TARGET
from bench.training_speed import FRONT_CAMERA_TARGET_S, TRAINING_SPEEDUP_TARGET

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Target:
    """One figure of a saved result, ``read`` from its JSON, against ``goal`` (``at_least``: ≥, else ≤);
    ``outcomes`` names the figure on the goal's side and off it (a bound says whether a target can be met)."""

    label: str
    result: str  # bench/results/<result>.json, written by the script of that name
    read: Callable[[dict], float]
    goal: float
    at_least: bool
    show: Callable[[float], str]
    outcomes: tuple[str, str] = ("met", "not met")


def share(value: float) -> str:
    return f"{value:.0%}"


TARGETS = (
    Target("1. pixel env / render-free physics steps/s (bench.renderer)", "renderer",
           lambda r: r["speed"]["fast_share_of_render_free"], PIXEL_SHARE_TARGET, True, share),
    Target("   fidelity: mean |fast − stock| after the zoom-in, 0–255", "renderer",
           lambda r: r["fidelity"]["mae_after_zoom_in"], FIDELITY_TARGET, False, lambda v: f"{v:.3f}"),
    Target("   front-camera env / render-free physics steps/s (bench.front_camera)", "front-camera",
           lambda r: r["env"]["udacity_style_share_of_render_free"], PIXEL_SHARE_TARGET, True, share),
    Target("2. `nsacdrive eval`, 2 workers / 2 × one env (bench.closed_loop_speed)", "closed_loop_speed",
           lambda r: r["evaluator_share_of_two_envs"], EVALUATOR_TARGET, True, share),
    Target("   its bound on 2 cores: env alone + controller, state, expert label per step", "closed_loop_speed",
           lambda r: r["evaluator_two_core_bound"], EVALUATOR_TARGET, True, share, ("within reach", "out of reach")),
    Target("3. NSAC training samples/s, now / before (bench.training_speed)", "training_speed",
           lambda r: r["nsac_before_and_now"]["speedup"], TRAINING_SPEEDUP_TARGET, True, lambda v: f"{v:.2f}×"),
    Target("   the same, opt-in `precision: bfloat16` (recipes stay float32; docs/guide/train.md)", "training_speed",
           lambda r: r["nsac_before_and_now"]["bfloat16_speedup"], TRAINING_SPEEDUP_TARGET, True, lambda v: f"{v:.2f}×"),
    Target("   data pipeline, 4-frame sequences/s (bench.data_pipeline)", "data-pipeline",
           lambda r: r["store_later_epochs"], TARGET_SAMPLES_PER_S, True, lambda v: f"{v:,.0f}"),
    Target("   front-camera training step, batch 32, s (bench.training_speed)", "training_speed",
           lambda r: r["front_camera_whole_step"]["step_seconds"][-1], FRONT_CAMERA_TARGET_S, False, lambda v: f"{v:.3f} s"),
)


def saved(result: str) -> tuple[dict | None, str]:
    """The saved JSON of ``result`` (the full run's, else the quick run's) and its file name."""
    for name in (f"{result}.json", f"{result}-quick.json"):
        path = RESULTS / name
        if path.is_file():
            return json.loads(path.read_text()), name
    return None, ""


def verdict(target: Target) -> tuple[str, str]:
    """(the figure, its outcome — "met" / "not met" by default — or why there is none) for one target."""
    result, name = saved(target.result)
    if result is None:
        return "—", f"not measured: run python -m bench.{target.result.replace('-', '_')}"
    try:
        value = target.read(result)
    except (KeyError, IndexError, TypeError):
        return "—", f"not in bench/results/{name}: run its script again"
    met = value >= target.goal if target.at_least else value <= target.goal
    return target.show(value) + (" (--quick)" if name.endswith("-quick.json") else ""), target.outcomes[0 if met else 1]


def accelerator_row() -> tuple[str, str]:
    """Target 4: the GPU figures when a GPU was there, else that it was not run."""
    result, name = saved("accelerator")
    if result is None:
        return "—", "not measured: run python -m bench.accelerator"
    cuda, cpu, note = result.get("cuda"), result["cpu"], " (--quick)" if name.endswith("-quick.json") else ""
    if cuda is None:
        return f"CPU only{note}", "not run on a GPU (none on this machine)"
    speedup = cuda["train_samples_per_s"] / cpu["train_samples_per_s"]
    return f"{cuda['train_samples_per_s']:.0f} samples/s on {cuda['name']} ({speedup:.1f}× the CPU){note}", "run"


def main() -> None:
    rows = []
    for target in TARGETS:
        figure, outcome = verdict(target)
        relation = "≥" if target.at_least else "≤"
        rows.append((target.label, f"{figure:>16}   target {relation} {target.show(target.goal):<9} {outcome}"))
    figure, outcome = accelerator_row()
    rows.append(("4. training and control on a GPU (bench.accelerator)", f"{figure}: {outcome}"))
    print_table("throughput targets (figures from bench/results/)", rows)


if __name__ == "__main__":
    main()
