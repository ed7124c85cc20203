"""Figures of a closed-loop evaluation: where each controller drove, what it did, how unsure it was.

Per episode (from ``episodes/<id>.npz``):

* ``<id>_path.png`` — the driven path on the track map, coloured by |lateral error| (the
  colour bar is marked at the road edge), by the total predictive steering std
  √(aleatoric + epistemic), and by the executed steering;
* ``<id>_actions.png`` — steer, gas and brake over the episode: the controller's raw mean with
  a ±2σ band, the executed action and the privileged expert's action for the same states;
* ``<id>_uncertainty.png`` — steering std against |lateral error| with their Spearman ρ
  (does the controller know when it drives badly?).

Per evaluation: ``evaluation.png`` — success rate (lap finished) per controller and colour
preset with the std over repeats from ``aggregates.json``, and the score distribution.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot global
state, safe in workers and tests) and written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from nsacdrive.common.figures import new_figure, save_figure
from nsacdrive.envs.car_racing import FPS, env_track
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH
from nsacdrive.eval.results import (
    condition_label,
    describe_action_settings,
    group_label,
    load_aggregates,
    load_episode,
    load_records,
)

ACTION_NAMES = ("steer", "gas", "brake")
ACTION_LIMITS = ((-1.0, 1.0), (0.0, 1.0), (0.0, 1.0))
PATH_MARGIN = 30.0  # world units shown around the driven path (a lap shows the whole track)


@dataclass(frozen=True)
class TrackMap:
    """A track's centreline (N, 2) and its road tiles (N, 4, 2), in world coordinates."""

    centreline: np.ndarray
    road: np.ndarray

    @classmethod
    def from_env_track(cls, track: np.ndarray) -> TrackMap:
        """From ``env.unwrapped.track`` rows (alpha, beta, x, y): tile i joins vertices i−1 and i,
        each widened by the half width along (cos β, sin β), as gymnasium builds its tiles."""
        track = np.asarray(track, dtype=np.float64)
        centre, beta = track[:, 2:4], track[:, 1]
        offset = TRACK_HALF_WIDTH * np.stack([np.cos(beta), np.sin(beta)], axis=1)
        left, right = centre - offset, centre + offset
        road = np.stack([left, right, np.roll(right, 1, axis=0), np.roll(left, 1, axis=0)], axis=1)
        return cls(centreline=centre, road=road)


def track_map(colour_preset: str, track_seed: int) -> TrackMap:
    """The track an episode drove on, regenerated from its seed (render-free, no pixels drawn)."""
    return TrackMap.from_env_track(env_track(colour_preset, track_seed))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (ties get their average rank); NaN when undefined."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, tie_group, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.bincount(tie_group, weights=ranks) / counts)[tie_group]


def predictive_std(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Total predictive std per action (N, 3): √(aleatoric + epistemic)."""
    return np.sqrt(arrays["aleatoric"] + arrays["epistemic"])


# --------------------------------------------------------------------------- per episode


def write_episode_figures(eval_dir: Path, episode_id: str, out_dir: Path) -> list[Path]:
    """Path map, action traces and uncertainty scatter of one finished episode; returns the files."""
    record, arrays = load_episode(Path(eval_dir), episode_id)
    track = track_map(record["colour_preset"], record["track_seed"])
    title = (f"{episode_id} — {group_label(record)}, score {record['score']:.0f}, "
             f"{record['steps']} steps, {record['reason']}")
    out_dir = Path(out_dir)
    return [
        save_figure(path_figure(track, arrays, title), out_dir / f"{episode_id}_path.png"),
        save_figure(actions_figure(arrays, title), out_dir / f"{episode_id}_actions.png"),
        save_figure(uncertainty_figure(arrays, title), out_dir / f"{episode_id}_uncertainty.png"),
    ]


def path_figure(track: TrackMap, arrays: dict[str, np.ndarray], title: str) -> Figure:
    """Three track maps of the driven path: |lateral error|, steering std, executed steering."""
    fig = new_figure(figsize=(16, 5.4))
    lateral = np.abs(arrays["lateral_error"])
    axes = fig.subplots(1, 3)
    path_panel(axes[0], track, arrays["pose"], lateral, "|lateral error| (world units)", "magma_r",
                Normalize(0.0, max(float(lateral.max()), TRACK_HALF_WIDTH)), edge=TRACK_HALF_WIDTH)
    std = predictive_std(arrays)[:, 0]
    path_panel(axes[1], track, arrays["pose"], std, "predictive steering std", "viridis", Normalize(0.0, float(std.max()) or 1.0))
    path_panel(axes[2], track, arrays["pose"], arrays["executed_action"][:, 0], "executed steer (+ right)", "coolwarm",
                Normalize(-1.0, 1.0))
    fig.suptitle(title)
    return fig


def path_panel(ax: Axes, track: TrackMap, pose: np.ndarray, values: np.ndarray, label: str, cmap: str,
                norm: Normalize, edge: float | None = None) -> None:
    """Road as a grey band, centreline dashed, the path as dots coloured by ``values``, start starred;
    zoomed to the path so that short episodes stay visible."""
    ax.add_collection(PolyCollection(track.road, facecolors="0.8", edgecolors="0.8", linewidths=0.5))
    loop = np.vstack([track.centreline, track.centreline[:1]])
    ax.plot(loop[:, 0], loop[:, 1], color="white", linewidth=0.6, linestyle="--")
    dots = ax.scatter(pose[:, 0], pose[:, 1], c=values, cmap=cmap, norm=norm, s=5, linewidths=0, zorder=3)
    ax.plot(pose[0, 0], pose[0, 1], marker="*", markersize=13, color="black", linestyle="none", zorder=4, label="start")
    bar = ax.figure.colorbar(dots, ax=ax, shrink=0.8)
    bar.set_label(label)
    if edge is not None:
        bar.ax.axhline(edge, color="red", linewidth=1.5)  # road edge: beyond it the car is off road
    low, high = pose[:, :2].min(axis=0) - PATH_MARGIN, pose[:, :2].max(axis=0) + PATH_MARGIN
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(loc="upper right", fontsize=8)


def actions_figure(arrays: dict[str, np.ndarray], title: str) -> Figure:
    """Steer, gas, brake per step: raw mean ± 2σ, executed, and the expert's action."""
    fig = new_figure(figsize=(12, 8))
    steps = np.arange(len(arrays["raw_action"]))
    std = predictive_std(arrays)
    axes = fig.subplots(3, 1, sharex=True)
    for k, (ax, name, (low, high)) in enumerate(zip(axes, ACTION_NAMES, ACTION_LIMITS)):
        mean = arrays["raw_action"][:, k]
        ax.fill_between(steps, mean - 2 * std[:, k], mean + 2 * std[:, k], color="C0", alpha=0.25, linewidth=0,
                        label="controller mean ± 2σ")
        ax.plot(steps, mean, color="C0", linewidth=1, label="controller mean")
        ax.plot(steps, arrays["executed_action"][:, k], color="C1", linewidth=1, label="executed")
        ax.plot(steps, arrays["expert_action"][:, k], color="black", linewidth=1, linestyle="--", label="expert")
        ax.set_ylim(low - 0.5, high + 0.5)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8, ncol=4)
    axes[-1].set_xlabel("step")
    fig.suptitle(title)
    return fig


def uncertainty_figure(arrays: dict[str, np.ndarray], title: str) -> Figure:
    """Steering std against |lateral error| per step, coloured by step, with Spearman ρ."""
    fig = new_figure(figsize=(7, 5.5))
    ax = fig.subplots()
    std = predictive_std(arrays)[:, 0]
    lateral = np.abs(arrays["lateral_error"])
    dots = ax.scatter(std, lateral, c=np.arange(len(std)), cmap="viridis", s=8, linewidths=0)
    fig.colorbar(dots, ax=ax, label="step")
    ax.axhline(TRACK_HALF_WIDTH, color="red", linewidth=1, linestyle=":", label="road edge")
    ax.set_xlabel("predictive steering std")
    ax.set_ylabel("|lateral error| (world units)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Spearman ρ(steering std, |lateral error|) = {spearman(std, lateral):.2f}  (n = {len(std)})")
    fig.suptitle(title, fontsize=9)
    return fig


# --------------------------------------------------------------------------- per evaluation


def write_evaluation_figures(eval_dir: Path, out_dir: Path) -> list[Path]:
    """``evaluation.png``: success rate per controller and preset, and the score distribution."""
    settings = load_aggregates(Path(eval_dir))
    records = load_records(Path(eval_dir))
    return [save_figure(evaluation_figure(settings, records, Path(eval_dir).name), Path(out_dir) / "evaluation.png")]


def evaluation_figure(settings: dict[str, Any], records: list[dict[str, Any]], title: str) -> Figure:
    """Grouped by condition (colour preset, and corruption if any), one colour per controller: success
    bars with std error bars, and box plots of the episode scores with every episode as a dot."""
    rows = settings["aggregates"]
    presets = list(dict.fromkeys(condition_label(r) for r in rows))
    labels = sorted({group_label(r) for r in rows})
    width = 0.8 / len(labels)
    fig = new_figure(figsize=(max(8.0, 2.5 * len(presets) * len(labels) ** 0.5 + 4), 5))
    success_ax, score_ax = fig.subplots(1, 2)
    jitter = np.random.default_rng(0)
    for i, label in enumerate(labels):
        offset = (i - (len(labels) - 1) / 2) * width
        mine = {condition_label(r): r for r in rows if group_label(r) == label}
        x = [p + offset for p, preset in enumerate(presets) if preset in mine]
        success_ax.bar(x, [mine[p]["success_mean"] for p in presets if p in mine], width * 0.9,
                       yerr=[mine[p]["success_std"] for p in presets if p in mine], capsize=3, color=f"C{i}", label=label)
        scores = [np.array([r["score"] for r in records if group_label(r) == label and condition_label(r) == p])
                  for p in presets if p in mine]
        boxes = score_ax.boxplot(scores, positions=x, widths=width * 0.8, showfliers=False, patch_artist=True,
                                   medianprops={"color": "black"})
        for box in boxes["boxes"]:
            box.set(facecolor=f"C{i}", alpha=0.35)
        for position, values in zip(x, scores):
            spread = jitter.uniform(-width * 0.3, width * 0.3, len(values))
            score_ax.scatter(position + spread, values, color=f"C{i}", s=10, zorder=3)
    for ax in (success_ax, score_ax):
        ax.set_xticks(range(len(presets)), presets)
        ax.set_xlabel("colour preset")
        ax.grid(axis="y", alpha=0.3)
    success_ax.set_ylim(0, 1.05)
    success_ax.set_ylabel("success rate (lap finished), ± std over repeats")
    success_ax.legend(fontsize=8)
    score_ax.axhline(900, color="black", linewidth=0.8, linestyle=":")
    score_ax.set_ylabel("episode score (dotted: 900)")
    fig.suptitle(f"{title}: {len(records)} episodes, max {settings['max_steps']} steps, {describe_action_settings(settings)}")
    return fig


# --------------------------------------------------------------------------- offline table

OFFLINE_METRICS = ("mse", "nll", "crps", "mace", "sharpness", "ause", "spearman", "ood_auroc")


def offline_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    """The offline table (``nsacdrive.eval.offline.table_rows``) as bars: one panel per metric, actions on the
    x axis, one bar per (model, condition); metrics a condition lacks (AUROC on clean) are left out."""
    groups = list(dict.fromkeys((r["model"], r["run"], r["condition"]) for r in rows))
    actions = list(dict.fromkeys(r["action"] for r in rows))
    width = 0.8 / len(groups)
    fig = new_figure(figsize=(16, 7))
    axes = fig.subplots(2, len(OFFLINE_METRICS) // 2).ravel()
    for ax, metric in zip(axes, OFFLINE_METRICS):
        for i, group in enumerate(groups):
            mine = {r["action"]: r.get(metric) for r in rows if (r["model"], r["run"], r["condition"]) == group}
            x = [a + (i - (len(groups) - 1) / 2) * width for a, action in enumerate(actions) if mine.get(action) is not None]
            heights = [float(mine[action]) for action in actions if mine.get(action) is not None]
            ax.bar(x, heights, width * 0.9, color=f"C{i}", label=f"{group[0]} ({group[1]}), {group[2]}")
        ax.set_xticks(range(len(actions)), actions)
        ax.set_title(metric)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return fig


#: The metrics of :func:`severity_figure`, one row of panels each (steering; `_cal` where recalibrated).
SEVERITY_METRICS = ("mse", "crps", "coverage_90", "error_auroc", "ood_auroc", "ood_auroc_density")


def corruption_of_condition(condition: str) -> tuple[str, int] | None:
    """``fog-3`` → ("fog", 3); None for conditions that are not a corruption (clean, colour presets)."""
    family, _, severity = condition.rpartition("-")
    from nsacdrive.envs.corruptions import CORRUPTIONS

    return (family, int(severity)) if family in CORRUPTIONS and severity.isdigit() else None


def severity_figure(rows: list[dict[str, Any]], title: str, action: str = "steer") -> Figure | None:
    """The offline table against corruption severity: one column of panels per family, one row per
    metric of :data:`SEVERITY_METRICS`, one line per run (severity 0 = clean); None without corruptions.

    ``coverage_90`` is the recalibrated (conformal) coverage where the run has a calibration, with
    the 0.9 target drawn; AUROCs have the 0.5 line of no separation."""
    mine = [r for r in rows if r["action"] == action]
    families = list(dict.fromkeys(c[0] for r in mine if (c := corruption_of_condition(r["condition"]))))
    if not families:
        return None
    runs = list(dict.fromkeys((r["model"], r["run"]) for r in mine))
    fig = new_figure(figsize=(2.2 * len(families) + 1, 2.0 * len(SEVERITY_METRICS) + 1))
    axes = fig.subplots(len(SEVERITY_METRICS), len(families), squeeze=False, sharex=True, sharey="row")  # families comparable
    for column, family in enumerate(families):
        for row, metric in enumerate(SEVERITY_METRICS):
            ax = axes[row, column]
            for i, (model, run) in enumerate(runs):
                points = []
                for r in mine:
                    if (r["model"], r["run"]) != (model, run):
                        continue
                    corruption = corruption_of_condition(r["condition"])
                    severity = 0 if r["condition"] == "clean" else corruption[1] if corruption and corruption[0] == family else None
                    value = r.get(f"{metric}_cal") if r.get(f"{metric}_cal") is not None else r.get(metric)
                    if severity is not None and value is not None:
                        points.append((severity, float(value)))
                if points:
                    x, y = zip(*sorted(points))
                    ax.plot(x, y, marker="o", ms=3, color=f"C{i}", label=f"{model} ({run})")
            if metric == "coverage_90":
                ax.axhline(0.9, color="0.5", lw=0.8, ls="--")
                ax.set_ylim(0.0, 1.02)
            elif metric.startswith(("error_auroc", "ood_auroc")):
                ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
                ax.set_ylim(0.0, 1.02)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(family, fontsize=9)
            if column == 0:
                ax.set_ylabel(metric, fontsize=8)
            if row == len(SEVERITY_METRICS) - 1:
                ax.set_xlabel("severity")
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=6)
    fig.suptitle(f"{title}: {action}, clean (0) to severity 5")
    return fig


def monitor_window_figure(result: dict[str, Any], window: str) -> Figure:
    """Precision, recall, F3 and FPR of every monitor score at one reaction window (``monitor.json``)."""
    names = list(result["scores"])
    metrics = ("precision", "recall", "f3", "fpr")
    fig = new_figure(figsize=(max(6.0, 1.1 * len(names) + 2), 4))
    ax = fig.subplots()
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        values = [result["scores"][n]["windows"][window][metric] for n in names]
        x = [k + (i - (len(metrics) - 1) / 2) * width for k, v in enumerate(values) if v is not None]
        ax.bar(x, [v for v in values if v is not None], width * 0.9, color=f"C{i}", label=metric)
    ax.set_xticks(range(len(names)), [n + ("" if result["scores"][n]["uses_uncertainty"] else "\n(baseline)") for n in names],
                  fontsize=7)
    ax.axhline(0.9, color="0.5", lw=0.8, ls="--")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=4)
    ax.set_title(f"misbehaviour prediction, {window} s reaction window (threshold: {result['config']['threshold']})")
    return fig


def monitor_traces_figure(episodes: list[Any], result: dict[str, Any], names: list[str], limit: int = 4) -> Figure | None:
    """Scores over time divided by their thresholds (an alarm is a value above 1) for up to ``limit``
    episodes with failures: onsets as red lines, the second before each shaded; None without failures."""
    chosen = [e for e in episodes if e.events][:limit]
    if not chosen:
        return None
    fig = new_figure(figsize=(12, 2.4 * len(chosen) + 0.5))
    axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
    for ax, episode in zip(axes, chosen):
        t = np.arange(episode.steps) / FPS
        for i, name in enumerate(n for n in names if n in episode.scores):
            ratio = episode.scores[name] / result["scores"][name]["threshold"]
            ax.plot(t, ratio, lw=0.9, color=f"C{i}", label=name)
            alarms = ratio > 1
            ax.plot(t[alarms], np.full(int(alarms.sum()), 1.9 - 0.08 * i), "|", color=f"C{i}", ms=4)
        for event in episode.events:
            ax.axvline(event.onset / FPS, color="red", lw=1.2)
            ax.axvspan(max(event.onset - FPS, 0) / FPS, event.onset / FPS, color="red", alpha=0.12)
            ax.text(event.onset / FPS, 1.95, f" {event.kind}", color="red", fontsize=7, va="top")
        ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
        ax.set_ylim(0, 2.0)
        ax.set_ylabel("score / threshold", fontsize=8)
        ax.set_title(episode.episode_id, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=len(names), loc="upper left")
    axes[-1].set_xlabel("time (s)")
    return fig
