"""Neuron-level potentials: the real internals of every prediction of a driven episode.

The published "κ/φ/ψ potentials" were thirds of one neuron group of a surrogate recurrent pass,
placed on the track by step fraction (docs/nsac.md#internals). Here an
:class:`InternalsRecorder` hooks the network of the closed-loop agent while an episode is
re-driven (:func:`nsacdrive.eval.video.redrive_episode`, which checks that the actions are the logged ones),
so every value comes from the very forward pass that chose the step's action, and is stored with
the car's pose, track progress, executed steering and the curvature ahead.

Per step (batch 1, the newest frame's query; means over heads h and selected keys j):

* NSAC (``return_internals=True`` switched on by a pre-hook): φ, κ, ψ, the gated effective time
  τ, the OU marginal's mean and std; the attention weights of every draw summarised as the
  weight on the newest frame (mean over draws and heads, and its std over draws), the entropy
  (nats, mean over draws and heads), the weights per frame slot; the circuit's inter, command
  and motor activations (group means, and per neuron in the data file).
* NAC-based heads (nac, gmle, mcdropout, evidential): the circuit group activations and the
  attention entropy / weights (forward hooks on the backbone and the attention dropout, whose
  input is the softmax weights); NAC has no OU parameters.
* Lévy: per action query the evidence Λ, the disagreement trΣ_V and the deviation σ̂.
* Ensemble and SDE-Net: no single circuit to record (the report says so).

Statistics read from the real values: Pearson and Spearman correlation of every trace with the
executed steering and with the curvature ahead (track geometry at the car's progress plus
``curvature_lookahead``; > 0 turns left, while steer > 0 steers right), and mean ± std per
steering band: left (steer < −b), straight (|steer| ≤ b), right (steer > b).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from torch import nn

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json, atomic_write_npz, json_safe
from nsacdrive.common.figures import new_figure
from nsacdrive.controllers.actions import ACTION_NAMES
from nsacdrive.controllers.controller import Controller
from nsacdrive.controllers.heads import LevyHead
from nsacdrive.controllers.nsac import NAC, NSAC, NSACInternals, scatter_to_positions
from nsacdrive.envs.geometry import TrackGeometry
from nsacdrive.eval.plots import TrackMap, path_panel, spearman
from nsacdrive.eval.results import EvaluationError

BANDS = ("left", "straight", "right")


@dataclass(frozen=True)
class PotentialConfig:
    """``steer_band``: half width b of the straight band; ``curvature_lookahead``: world units ahead
    of the car's progress at which the upcoming curvature is read (averaged over 10 units)."""

    steer_band: float = 0.1
    curvature_lookahead: float = 20.0


# --------------------------------------------------------------------------- recording


class InternalsRecorder:
    """Hooks a :class:`nsacdrive.eval.driver.ControllerAgent`'s network; one summary row per prediction.

    Pass :meth:`attach` as ``on_agent`` to the re-drive. ``kind`` says what was found: ``nsac``,
    ``nac``, ``levy`` or ``none`` (then ``reason`` says why nothing is recorded). In a lockstep
    group only this episode's ``row`` of the batch is recorded: batched heads see every row in
    one call (the row is sliced out); heads that predict row by row (``episode_row`` set by
    :meth:`nsacdrive.controllers.heads.UncertaintyHead.predict_episodes`) are recorded on this row's call.
    """

    def __init__(self) -> None:
        self.kind = "none"
        self.reason = "not attached to a controller yet"
        self.rows: list[dict[str, float]] = []
        self.neuron_rows: list[dict[str, np.ndarray]] = []
        self._frames = 0  # T, read from the layer input
        self._pending: dict[str, Any] = {}
        self.row = 0
        self._head: Any = None
        self._agent: Any = None

    def attach(self, agent: Any, row: int = 0) -> None:
        """Register the hooks on ``agent.model`` (the ``on_agent`` callback of a re-drive) for batch row ``row``."""
        model = agent.model
        head = model.head if isinstance(model, Controller) else None
        self.row, self._head, self._agent = row, head, agent
        if head is None:
            self.reason = f"{type(model).__name__} holds several controllers; there is no single circuit to record"
            return
        nsac = [m for m in head.modules() if isinstance(m, NSAC)]
        nac = [m for m in head.modules() if isinstance(m, NAC)]
        if len(nsac) == 1:
            self.kind = "nsac"
            nsac[0].register_forward_pre_hook(self._nsac_pre, with_kwargs=True)
            nsac[0].register_forward_hook(self._nsac_post)
        elif len(nac) == 1:
            self.kind = "nac"
            layer = nac[0]
            layer.register_forward_pre_hook(self._remember_frames)
            layer.backbone.register_forward_hook(self._nac_circuit)
            layer.core.attention_dropout.register_forward_hook(self._nac_attention)
            self._nac = layer
        elif isinstance(head, LevyHead):
            self.kind = "levy"
            head.actions.register_forward_hook(self._levy_post)
        else:
            self.reason = f"{type(head).__name__} has no attention circuit (no φ, κ, ψ or attention weights to record)"
            return
        self.reason = ""

    # NSAC ---------------------------------------------------------------------------------
    def _rows(self) -> slice | None:
        """The batch rows of this episode in the current call, or None when the call is another row's
        or comes after this episode ended (a lockstep group predicts until its last episode ends)."""
        live = getattr(self._agent, "live", None)
        if live is not None and not live[self.row]:
            return None
        per_row = getattr(self._head, "episode_row", None)
        if per_row is None:
            return slice(self.row, self.row + 1)
        return slice(None) if per_row == self.row else None

    def _nsac_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self._frames = int(args[0].shape[1])
        return args, {**kwargs, "return_internals": True}

    def _nsac_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        rows = self._rows()
        if rows is None:
            return
        internals: NSACInternals = output.internals.rows(rows)
        row = {name: _mean(getattr(internals, attr)) for name, attr in
               (("phi", "phi"), ("kappa", "kappa"), ("psi", "psi"), ("effective_time", "effective_time"),
                ("ou_mean", "ou_mean"), ("ou_std", "ou_std"))}
        per_draw = _per_frame_weights(internals.attention[:, 0, :, 0], internals.key_index[0, :, 0], self._frames)  # [S, H, T]
        row.update(_attention_summary(internals.attention[:, 0, :, 0], per_draw))
        self._add(row, internals.circuit, per_draw.mean((0, 1)))

    # NAC ----------------------------------------------------------------------------------
    def _remember_frames(self, module: nn.Module, args: tuple) -> None:
        self._frames = int(args[0].shape[1])

    def _nac_circuit(self, module: nn.Module, args: tuple, output: Any) -> None:
        rows = self._rows()
        if rows is not None:
            self._pending["circuit"] = output[1].rows(rows)

    def _nac_attention(self, module: nn.Module, args: tuple, output: Any) -> None:
        rows = self._rows()
        if rows is None:
            return
        weights = args[0].detach()[rows]  # softmax weights [B(·S), H, 1, K] before dropout
        config = self._nac.config
        draws = weights[:, :, 0]  # every row of the batch is one draw of the same step (MC dropout repeats it)
        # All keys kept, in frame order (corrected mode, K ≥ T); otherwise (block top-K, K < T) the
        # layer does not expose which frame a weight belongs to, and only the entropy is recorded.
        per_draw = draws if config.mode == "corrected" and weights.shape[-1] == self._frames else None
        row = _attention_summary(draws, per_draw)
        self._add(row, self._pending.pop("circuit"), None if per_draw is None else per_draw.mean((0, 1)))

    # Lévy ---------------------------------------------------------------------------------
    def _levy_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        rows = self._rows()
        if rows is None:
            return
        attention = output.attention
        row = {}
        for signal, values in (("evidence", attention.evidence), ("disagreement", attention.disagreement),
                               ("deviation", attention.deviation)):
            for k, action in enumerate(ACTION_NAMES):
                row[f"{signal}_{action}"] = float(values[rows][0, k])
        self.rows.append(row)
        self.neuron_rows.append({})

    def _add(self, row: dict[str, float], circuit: Any, frame_weights: torch.Tensor | None) -> None:
        neurons = {}
        for group in ("inter", "command", "motor"):
            activation = getattr(circuit, group).detach()
            per_neuron = activation.reshape(-1, activation.shape[-1]).mean(0)
            row[group] = float(per_neuron.mean())
            neurons[group] = per_neuron.numpy()
        if frame_weights is not None:
            neurons["attention_per_frame"] = frame_weights.numpy()
        self.rows.append(row)
        self.neuron_rows.append(neurons)

    def traces(self) -> dict[str, np.ndarray]:
        """Per-step scalars, one array [steps] per name."""
        return {name: np.array([row[name] for row in self.rows]) for name in (self.rows[0] if self.rows else {})}

    def neurons(self) -> dict[str, np.ndarray]:
        """Per-step vectors [steps, n]: activations per neuron of each circuit group, attention per frame slot."""
        names = self.neuron_rows[0] if self.neuron_rows else {}
        return {name: np.stack([row[name] for row in self.neuron_rows]) for name in names}


def _mean(values: torch.Tensor) -> float:
    return float(values.detach().mean())


def _per_frame_weights(attention: torch.Tensor, key_index: torch.Tensor, frames: int) -> torch.Tensor:
    """Attention [S, H, K] of the selected keys → weight per frame slot [S, H, T] (0 where unselected)."""
    return scatter_to_positions(attention.detach(), key_index, frames)


def _attention_summary(weights: torch.Tensor, per_frame: torch.Tensor | None) -> dict[str, float]:
    """Weights [S, H, K] and per frame slot [S, H, T] → entropy in nats (mean over draws and heads)
    and, when the frame slots are known, the weight on the newest frame (mean, and std over draws
    of the head mean)."""
    weights = weights.detach()
    entropy = -(weights * torch.log(weights.clamp_min(1e-12))).sum(-1)
    summary = {"attention_entropy": float(entropy.mean())}
    if per_frame is not None:
        newest = per_frame[..., -1]
        summary["attention_newest"] = float(newest.mean())
        summary["attention_newest_draw_std"] = float(newest.mean(1).std(unbiased=False))
    return summary


# --------------------------------------------------------------------------- statistics


def correlations(values: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Pearson r and Spearman ρ of two per-step series (NaN when either is constant)."""
    values, reference = np.asarray(values, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    ok = np.isfinite(values) & np.isfinite(reference)
    x, y = values[ok], reference[ok]
    pearson = float(np.corrcoef(x, y)[0, 1]) if len(x) > 1 and x.std() > 0 and y.std() > 0 else float("nan")
    return {"pearson": pearson, "spearman": spearman(x, y), "n": int(len(x))}


def steer_bands(steer: np.ndarray, threshold: float) -> np.ndarray:
    """'left' (steer < −b), 'straight' (|steer| ≤ b), 'right' (steer > b) per step."""
    steer = np.asarray(steer)
    return np.where(steer < -threshold, "left", np.where(steer > threshold, "right", "straight"))


def band_statistics(values: np.ndarray, steer: np.ndarray, threshold: float) -> dict[str, dict[str, float]]:
    """Per steering band: number of steps, mean and std of ``values`` (NaN for an empty band)."""
    bands = steer_bands(steer, threshold)
    values = np.asarray(values, dtype=np.float64)
    out = {}
    for band in BANDS:
        chosen = values[bands == band]
        out[band] = {"n": int(len(chosen)), "mean": float(chosen.mean()) if len(chosen) else float("nan"),
                     "std": float(chosen.std()) if len(chosen) else float("nan")}
    return out


def unwrapped_progress(progress: np.ndarray, length: float) -> np.ndarray:
    """Arc length travelled along the centreline: progress with the lap seam (and reversing across
    it) unwrapped, so a full lap runs from ~0 to ~length instead of jumping back to 0."""
    steps = np.diff(np.asarray(progress, dtype=np.float64), prepend=progress[0])
    steps = np.where(steps < -length / 2, steps + length, np.where(steps > length / 2, steps - length, steps))
    return progress[0] + np.cumsum(steps)


@dataclass
class EpisodePotentials:
    """One episode's per-step traces with where the car was and what it did."""

    episode_id: str
    title: str
    kind: str
    reason: str
    pose: np.ndarray
    progress: np.ndarray  # unwrapped arc length, world units
    steer: np.ndarray  # executed steering
    curvature: np.ndarray  # ahead of the car, rad per world unit (> 0 turns left)
    traces: dict[str, np.ndarray]
    neurons: dict[str, np.ndarray]
    track: TrackMap
    config: PotentialConfig = field(default_factory=PotentialConfig)

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Per trace: correlations with steering and curvature ahead, and the steering-band statistics."""
        return {name: {"steer": correlations(values, self.steer), "curvature_ahead": correlations(values, self.curvature),
                       "bands": band_statistics(values, self.steer, self.config.steer_band)}
                for name, values in self.traces.items()}


def episode_potentials(episode_id: str, title: str, arrays: dict[str, np.ndarray], recorder: InternalsRecorder,
                       track_rows: np.ndarray, config: PotentialConfig = PotentialConfig()) -> EpisodePotentials:
    """Combine a re-drive's per-step log with what the recorder saw (one row per step, checked)."""
    steps = len(arrays["executed_action"])
    if recorder.kind != "none" and len(recorder.rows) != steps:
        raise EvaluationError(f"{episode_id}: recorded {len(recorder.rows)} predictions for {steps} steps")
    geometry = TrackGeometry.from_env_track(track_rows)
    progress = arrays["progress"].astype(np.float64)
    curvature = geometry.curvature_ahead(progress, np.array([config.curvature_lookahead]))[:, 0]
    return EpisodePotentials(episode_id, title, recorder.kind, recorder.reason, arrays["pose"],
                             unwrapped_progress(progress, geometry.length), arrays["executed_action"][:, 0].astype(np.float64),
                             curvature, recorder.traces(), recorder.neurons(), TrackMap.from_env_track(track_rows), config)


# --------------------------------------------------------------------------- files


def write_potential_data(potentials: EpisodePotentials, out_dir: Path) -> list[Path]:
    """``<id>_potentials.csv`` (per step), ``<id>_potentials.json`` (statistics) and ``<id>_neurons.npz``."""
    out_dir = Path(out_dir)
    columns = {"step": np.arange(len(potentials.steer)), "x": potentials.pose[:, 0], "y": potentials.pose[:, 1],
               "progress": potentials.progress, "steer": potentials.steer, "curvature_ahead": potentials.curvature,
               **potentials.traces}
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    writer.writerows(zip(*[np.asarray(v).tolist() for v in columns.values()]))
    stem = out_dir / f"{potentials.episode_id}_potentials"
    atomic_write_bytes(stem.with_suffix(".csv"), buffer.getvalue().encode())
    atomic_write_json(stem.with_suffix(".json"), {"episode_id": potentials.episode_id, "kind": potentials.kind,
                                                  "steer_band": potentials.config.steer_band,
                                                  "curvature_lookahead": potentials.config.curvature_lookahead,
                                                  "statistics": json_safe(potentials.statistics())})
    paths = [stem.with_suffix(".csv"), stem.with_suffix(".json")]
    if potentials.neurons:
        neurons = out_dir / f"{potentials.episode_id}_neurons.npz"
        atomic_write_npz(neurons, potentials.neurons)
        paths.append(neurons)
    return paths


# --------------------------------------------------------------------------- figures


def map_figure(potentials: EpisodePotentials) -> Figure:
    """(a) Every trace along the driven path on the track map."""
    names = list(potentials.traces)
    columns = min(4, len(names))
    rows = -(-len(names) // columns)
    fig = new_figure(figsize=(4.6 * columns, 4.0 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    for ax, name in zip(axes, names):
        values = potentials.traces[name]
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
        path_panel(ax, potentials.track, potentials.pose, values, name, "viridis", Normalize(low, high if high > low else low + 1e-9))
        ax.set_title(name, fontsize=10)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(f"{potentials.title}: internals along the driven path (start starred)")
    return fig


def progress_figure(potentials: EpisodePotentials) -> Figure:
    """(b) Executed steering, curvature ahead and every trace against track progress."""
    names = list(potentials.traces)
    extra = 1 if "attention_per_frame" in potentials.neurons else 0
    fig = new_figure(figsize=(12, 1.7 * (len(names) + 1 + extra) + 0.8))
    axes = np.atleast_1d(fig.subplots(len(names) + 1 + extra, 1, sharex=True))
    x = potentials.progress
    axes[0].plot(x, potentials.steer, color="C1", linewidth=1, label="executed steer (+ right)")
    twin = axes[0].twinx()
    twin.plot(x, potentials.curvature, color="black", linewidth=1, linestyle="--",
              label=f"curvature {potentials.config.curvature_lookahead:g} ahead (+ left)")
    axes[0].set_ylabel("steer")
    twin.set_ylabel("curvature")
    axes[0].legend(loc="upper left", fontsize=7)
    twin.legend(loc="upper right", fontsize=7)
    for ax, name in zip(axes[1:], names):
        ax.plot(x, potentials.traces[name], linewidth=1)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
    if extra:
        weights = potentials.neurons["attention_per_frame"]
        slots = weights.shape[1]
        axes[-1].stackplot(x, weights.T, labels=[f"frame {i - slots + 1}" if i < slots - 1 else "newest" for i in range(slots)])
        axes[-1].set_ylabel("attention per frame", fontsize=8)
        axes[-1].legend(loc="upper right", fontsize=7, ncol=slots)
    axes[-1].set_xlabel("progress along the centreline (world units, unwrapped)")
    fig.suptitle(f"{potentials.title}: internals against track progress")
    return fig


def steering_figure(potentials: EpisodePotentials) -> Figure:
    """(c) Every trace against executed steering (bands and their mean ± std) and curvature ahead."""
    names = list(potentials.traces)
    stats = potentials.statistics()
    fig = new_figure(figsize=(11, 2.6 * len(names) + 0.8))
    axes = np.atleast_2d(fig.subplots(len(names), 2))
    band = potentials.config.steer_band
    colours = {"left": "C0", "straight": "0.4", "right": "C3"}
    bands = steer_bands(potentials.steer, band)
    centres = {"left": -0.5 - band / 2, "straight": 0.0, "right": 0.5 + band / 2}
    for row, name in enumerate(names):
        values = potentials.traces[name]
        ax = axes[row, 0]
        for label in BANDS:
            chosen = bands == label
            ax.scatter(potentials.steer[chosen], values[chosen], s=5, color=colours[label], alpha=0.5, linewidths=0)
            summary = stats[name]["bands"][label]
            if summary["n"]:
                ax.errorbar(centres[label], summary["mean"], yerr=summary["std"], color=colours[label], marker="s",
                            capsize=4, markersize=6, markeredgecolor="black", label=f"{label} band mean ± std")
        for edge in (-band, band):
            ax.axvline(edge, color="black", linewidth=0.6, linestyle=":")
        corr = stats[name]["steer"]
        ax.set_title(f"{name} vs steer: r = {corr['pearson']:.2f}, ρ = {corr['spearman']:.2f}", fontsize=9)
        ax.set_ylabel(name, fontsize=8)
        if row == 0:
            ax.legend(fontsize=7, loc="upper left")
        ax = axes[row, 1]
        ax.scatter(potentials.curvature, values, s=5, c=potentials.steer, cmap="coolwarm", vmin=-1, vmax=1, linewidths=0)
        corr = stats[name]["curvature_ahead"]
        ax.set_title(f"{name} vs curvature ahead: r = {corr['pearson']:.2f}, ρ = {corr['spearman']:.2f}", fontsize=9)
    axes[-1, 0].set_xlabel(f"executed steer (bands at ±{band:g}; squares: band mean ± std)")
    axes[-1, 1].set_xlabel(f"curvature {potentials.config.curvature_lookahead:g} units ahead (+ left; dots coloured by steer)")
    fig.suptitle(f"{potentials.title}: internals against steering and upcoming curvature")
    return fig
