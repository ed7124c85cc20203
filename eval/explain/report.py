"""``nsacdrive report``: one static HTML page that explains a closed-loop evaluation.

``OUT/index.html`` is self-contained: inline CSS, no script, no external URL; every image sits in
``OUT/figures/`` and every number behind a figure in ``OUT/data/`` (CSV / JSON / NPZ), all referenced
by relative paths, so the folder opens offline and can be copied anywhere. Sections:

1. Closed loop: the aggregates table of ``aggregates.json`` and the :mod:`nsacdrive.eval.plots` figures of
   the evaluation and of the chosen episodes.
2. Offline (with ``offline``: an ``nsacdrive evaluate-offline`` folder): its table and a bar figure,
   and with corruptions the metrics against severity.
   Misbehaviour prediction (with ``monitor``: an ``nsacdrive monitor`` folder): its table, one
   figure per reaction window and the score traces around failures.
3. Grad-CAM (:mod:`nsacdrive.eval.explain.saliency`) on frames sampled along the first chosen episode's lap, clean
   and under a perturbation — the evaluation's own perturbed episode of the same track when
   there is one, else the same track driven now under the perturbation preset — and the
   randomisation sanity check.
4. Neuron-level potentials (:mod:`nsacdrive.eval.explain.potentials`) of every chosen episode, recorded while it is
   re-driven (the re-drive is checked against the logged actions).

By default the chosen episodes are the run's best-scoring track, clean and under the
perturbation (the evaluation's first non-default colour preset, else ``shift-3``), as logged:
the same two re-drives then serve Grad-CAM and the potentials, and the potentials of one track
can be compared clean against perturbed.

The report is built in a staging folder beside ``--out`` and moved into place when complete: a
failed report leaves no half-built folder, and a rerun replaces the earlier report whole.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.common.atomic import (
    PARTIAL_SUFFIX,
    STALE_SUFFIX,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_npz,
    json_safe,
    remove_abandoned_stages,
    replace_folder,
)
from nsacdrive.common.workers import torch_threads
from nsacdrive.controllers.run import load_run
from nsacdrive.data_collection.dataset import INTRO_STEPS, sequence_offsets, sequence_timestamps
from nsacdrive.envs.car_racing import env_track
from nsacdrive.eval.closed_loop import EpisodeKey, run_episode
from nsacdrive.eval.driver import history_indices
from nsacdrive.eval.explain.potentials import (
    BANDS,
    EpisodePotentials,
    InternalsRecorder,
    PotentialConfig,
    episode_potentials,
    map_figure,
    progress_figure,
    steering_figure,
    write_potential_data,
)
from nsacdrive.eval.explain.saliency import (
    TARGET_MEANINGS,
    TARGETS,
    GradCamMaps,
    GradCamUnavailable,
    SaliencyConfig,
    SaliencyInputs,
    display_frames,
    grad_cam,
    gradcam_figure,
    sanity_check,
    sanity_figure,
)
from nsacdrive.eval.offline import TABLE_METRICS, table_rows
from nsacdrive.eval.plots import (
    offline_figure,
    save_figure,
    severity_figure,
    write_episode_figures,
    write_evaluation_figures,
)
from nsacdrive.eval.results import (
    EvaluationError,
    choose_episodes,
    describe_action_settings,
    drive_config,
    group_label,
    load_aggregates,
    load_records,
)
from nsacdrive.eval.video import redrive_episode

DEFAULT_PERTURBATION = "shift-3"
AGGREGATE_COLUMNS = ("model", "run", "colour_preset", "corruption", "episodes", "failed", "success_mean", "success_std", "score_ge_900",
                     "score_ge_860", "score_mean", "mean_abs_lateral_error", "driving_score")
CSS = """
body { font-family: sans-serif; max-width: 1250px; margin: 1em auto; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #bbb; padding: 2px 6px; text-align: right; } th { background: #eee; }
td.text, th.text { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.3em 0; }
.note { background: #fff6d8; border-left: 4px solid #e0b000; padding: 0.4em 0.8em; }
.small { font-size: 0.85em; color: #555; }
"""


@dataclass(frozen=True)
class ReportConfig:
    """What the report explains and how much work it does (defaults sized for ``make demo``).

    ``run``: run name or folder to explain (default: the evaluation's only run); a folder path also
    replaces the recorded one. ``episodes``: episode ids (default: see the module docstring).
    ``frames``: Grad-CAM frames along the lap. ``perturbation``: colour preset of the perturbed
    frames (default: the evaluation's first non-default preset, else ``shift-3``)."""

    run: str | None = None
    offline: Path | None = None
    monitor: Path | None = None
    episodes: tuple[str, ...] | None = None
    frames: int = 4
    perturbation: str | None = None
    noise_seed: int = 0
    potentials: PotentialConfig = field(default_factory=PotentialConfig)

    def __post_init__(self) -> None:
        if self.perturbation == "default":
            raise ValueError("perturbation: choose a colour preset other than 'default' (the clean frames)")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")


@dataclass
class Drive:
    """One re-driven episode: its per-step log, the raw frames the controller saw, the recorder."""

    label: str
    preset: str
    arrays: dict[str, np.ndarray]
    frames: list[np.ndarray]
    recorder: InternalsRecorder
    logged: bool


class Report:
    """Builds the report folder section by section; :meth:`write` returns the index path."""

    def __init__(self, eval_dir: Path, out_dir: Path, config: ReportConfig = ReportConfig()) -> None:
        self.eval_dir, self.out, self.config = Path(eval_dir), Path(out_dir), config
        self.settings = load_aggregates(self.eval_dir)
        self.records = load_records(self.eval_dir)
        self.run_name, self.run_dir = self._resolve_run()
        self.mine = [r for r in self.records if Path(r["run"]).name == self.run_name]
        self.by_id = {r["episode_id"]: r for r in self.records}
        presets = [p for p in self.settings.get("colour_presets", []) if p != "default"]
        self.perturbation = config.perturbation or (presets[0] if presets else DEFAULT_PERTURBATION)
        self.chosen = self._chosen_episodes()
        self.model, self.train_config = load_run(self.run_dir, raw=drive_config(self.eval_dir).raw)  # as the evaluation drove
        self.samples = self.settings.get("samples") or self.train_config.model.predict_samples
        self.drive_settings = drive_config(self.eval_dir, self.samples)  # re-drives drive as the evaluation did
        self.drives: dict[str, Drive] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ inputs
    def _resolve_run(self) -> tuple[str, Path]:
        recorded = {Path(r["run"]).name: Path(r["run"]) for r in self.records}
        if self.config.run is None:
            if len(recorded) != 1:
                raise EvaluationError(f"{self.eval_dir}: the evaluation holds {len(recorded)} runs "
                                      f"({', '.join(sorted(recorded))}); choose one with --run")
            name = next(iter(recorded))
        else:
            name = Path(self.config.run).name
            if name not in recorded:
                raise EvaluationError(f"--run {self.config.run}: no episode of run {name!r} in {self.eval_dir} "
                                      f"(runs: {', '.join(sorted(recorded))})")
        given = Path(self.config.run) if self.config.run is not None else None
        folder = given if given is not None and given.is_dir() else recorded[name]
        if not (folder / "config.json").is_file():
            raise EvaluationError(f"{folder}: run folder not found (config.json missing); the evaluation recorded it "
                                  "relative to where `nsacdrive eval` ran: pass --run PATH to the run folder")
        return name, folder

    def _chosen_episodes(self) -> list[str]:
        if self.config.episodes is None:
            best = choose_episodes(self.mine, limit=1)
            if not best:
                raise EvaluationError(f"{self.eval_dir}: every episode of run {self.run_name} failed; nothing to explain")
            pair = [self._logged(self.by_id[best[0]], preset) for preset in ("default", self.perturbation)]
            return [e for e in pair if e is not None] or best
        unknown = sorted(set(self.config.episodes) - {r["episode_id"] for r in self.mine})
        if unknown:
            raise EvaluationError(f"--episodes: no episode {', '.join(unknown)} of run {self.run_name} in {self.eval_dir / 'episodes'}")
        return list(self.config.episodes)

    def _drive(self, episode_id: str) -> Drive:
        """A logged episode re-driven (cached), with the internals recorder attached."""
        if episode_id not in self.drives:
            recorder = InternalsRecorder()
            arrays, frames = redrive_episode(self.eval_dir, episode_id, self.samples, run=self.run_dir, on_agent=recorder.attach)
            record = self.by_id[episode_id]
            self.drives[episode_id] = Drive(episode_id, record["colour_preset"], arrays, frames, recorder, logged=True)
        return self.drives[episode_id]

    def _drive_unlogged(self, preset: str, seed: int, repeat: int) -> Drive:
        """The same track and repeat under another colour preset (not part of the evaluation)."""
        key = EpisodeKey(str(self.run_dir), preset, seed, repeat)
        frames: list[np.ndarray] = []
        record, arrays = run_episode(key, self.drive_settings,
                                     on_frame=lambda frame: frames.append(np.array(frame)))
        if record.failed:
            raise EvaluationError(f"{key.episode_id}: driving under {preset} for the Grad-CAM frames failed ({record.reason})")
        return Drive(f"{key.episode_id} (re-driven for this report)", preset, arrays, frames, InternalsRecorder(), logged=False)

    def _logged(self, record: dict[str, Any], preset: str) -> str | None:
        """The finished episode of ``record``'s track and repeat under ``preset``, if the evaluation has one."""
        for r in self.mine:
            same = (r["colour_preset"], r["track_seed"], r["repeat"]) == (preset, record["track_seed"], record["repeat"])
            if same and r.get("corruption", "none") == "none" and not r["failed"]:
                return r["episode_id"]
        return None

    def _counterpart(self, record: dict[str, Any], preset: str) -> Drive:
        """``record``'s track and repeat under ``preset``: the logged episode re-driven and checked, else driven now."""
        logged = self._logged(record, preset)
        return self._drive(logged) if logged else self._drive_unlogged(preset, record["track_seed"], record["repeat"])

    # ------------------------------------------------------------------ sections
    def write(self) -> Path:
        """Every section, then ``index.html`` (last, so a page on disk always has its files)."""
        started = time.perf_counter()
        with torch_threads(1):  # batch-1 re-drives: more threads only contend for the cores
            sections = [self._timed("closed_loop", self._closed_loop_section)]
            if self.config.offline is not None:
                sections.append(self._timed("offline", self._offline_section))
            if self.config.monitor is not None:
                sections.append(self._timed("monitor", self._monitor_section))
            sections.append(self._timed("grad_cam", self._gradcam_section))
            sections.append(self._timed("potentials", self._potentials_section))
        self.timings["total"] = time.perf_counter() - started
        index = self.out / "index.html"
        atomic_write_bytes(index, self._page(sections).encode())
        atomic_write_json(self.out / "data" / "report.json", {
            "eval_dir": str(self.eval_dir), "run": str(self.run_dir), "episodes": self.chosen, "frames": self.config.frames,
            "samples": self.samples, "noise_seed": self.config.noise_seed, "seconds": self.timings})
        return index

    def _timed(self, name: str, section) -> str:
        started = time.perf_counter()
        try:
            return section()
        finally:
            self.timings[name] = time.perf_counter() - started

    def _closed_loop_section(self) -> str:
        figures = self.out / "figures"
        paths = write_evaluation_figures(self.eval_dir, figures)
        episode_paths = {e: write_episode_figures(self.eval_dir, e, figures) for e in self.chosen}
        atomic_write_bytes(self.out / "data" / "aggregates.json", (self.eval_dir / "aggregates.json").read_bytes())
        summary = self.eval_dir / "summary.csv"
        links = [self._link(self.out / "data" / "aggregates.json")]
        if summary.is_file():
            atomic_write_bytes(self.out / "data" / "summary.csv", summary.read_bytes())
            links.append(self._link(self.out / "data" / "summary.csv"))
        parts = [
            "<h2>1. Closed loop</h2>",
            f"<p>{len(self.records)} episodes, at most {self.settings['max_steps']} steps each, "
            f"{describe_action_settings(self.settings)}, {self.samples} draws per prediction; "
            "success = lap finished (mean ± std over repeats), driving score = route completion × 0.8<sup>off-road events</sup>"
            " × 0.5 if the car left the playfield. Data: " + ", ".join(links) + ".</p>",
            _table(self.settings["aggregates"], AGGREGATE_COLUMNS),
            self._image(paths[0], "success rate and scores per controller and colour preset"),
        ]
        for episode_id, written in episode_paths.items():
            record = self.by_id[episode_id]
            parts.append(f"<h3>Episode {html.escape(episode_id)}</h3><p>{html.escape(group_label(record))}, "
                         f"score {record['score']:.0f}, {record['steps']} steps, {html.escape(record['reason'])}, "
                         f"mean |lateral error| {record['mean_abs_lateral_error']:.2f}.</p>")
            parts += [self._image(path, path.stem) for path in written]
        return "\n".join(parts)

    def _offline_section(self) -> str:
        folder = Path(self.config.offline)
        source = folder / "offline.json"
        if not source.is_file():
            raise EvaluationError(f"--offline {folder}: offline.json not found; expected a folder written by "
                                  "`nsacdrive evaluate-offline --out`")
        try:
            data = json.loads(source.read_text())
            rows = table_rows(data["results"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EvaluationError(f"{source}: not an offline table ({exc})") from None
        links = []
        for name in ("offline.md", "offline.csv", "offline.json"):
            if (folder / name).is_file():
                atomic_write_bytes(self.out / "data" / name, (folder / name).read_bytes())
                links.append(self._link(self.out / "data" / name))
        figure = save_figure(offline_figure(rows, f"offline metrics ({folder.name})"), self.out / "figures" / "offline.png")
        parts = [
            "<h2>2. Offline metrics</h2>",
            f"<p>Held-out recorded tracks, per model, condition and action; calibration: "
            f"{html.escape(str(data.get('calibration_convention', '')))}. Data: {', '.join(links)}.</p>",
            _table(rows, tuple(c for c in ("model", "run", "condition", "action", *TABLE_METRICS) if any(r.get(c) is not None for r in rows))),
            self._image(figure, "offline metrics"),
        ]
        severity = severity_figure(rows, f"held-out corruptions ({folder.name})")
        if severity is not None:
            parts.append("<p>Against corruption severity, one line per run (steering; coverage is the recalibrated "
                         "conformal one where the run has a calibration): where the error grows, the uncertainty "
                         "and OOD scores should grow with it.</p>")
            parts.append(self._image(save_figure(severity, self.out / "figures" / "severity.png"), "metrics against severity"))
        return "\n".join(parts)

    def _monitor_section(self) -> str:
        folder = Path(self.config.monitor)
        source = folder / "monitor.json"
        if not source.is_file():
            raise EvaluationError(f"--monitor {folder}: monitor.json not found; expected a folder written by `nsacdrive monitor --out`")
        try:
            result = json.loads(source.read_text())
            rows = [{"score": name, "uncertainty": "yes" if entry["uses_uncertainty"] else "no", "threshold": entry["threshold"],
                     "AUROC": entry["auroc"], "AUPRC": entry["auprc"], "curvature-stratified AUROC": entry["stratified_auroc"],
                     **{f"{w} s {metric}": counts[metric] for w, counts in entry["windows"].items()
                        for metric in ("precision", "recall", "fpr", "f3", "median_lead_s")}}
                    for name, entry in result["scores"].items()]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise EvaluationError(f"{source}: not a monitor result ({exc})") from None
        atomic_write_bytes(self.out / "data" / "monitor.json", source.read_bytes())
        parts = ["<h2>Misbehaviour prediction</h2>",
                 f"<p>{len(result['failures'])} failures in {result['episodes']} episodes; alarm thresholds "
                 f"({html.escape(result['config']['threshold'])}) fitted on {result['nominal_episodes']} nominal episodes. "
                 f"Data: {self._link(self.out / 'data' / 'monitor.json')}.</p>"]
        if rows:
            parts.append(_table(rows, tuple(rows[0])))
        for figure in sorted((folder / "figures").glob("*.png")):
            copy = self.out / "figures" / f"monitor-{figure.name}"
            atomic_write_bytes(copy, figure.read_bytes())
            parts.append(self._image(copy, f"monitor {figure.stem}"))
        return "\n".join(parts)

    def _gradcam_section(self) -> str:
        parts = ["<h2>3. Grad-CAM</h2>"]
        first = self.by_id[self.chosen[0]]
        clean, perturbed = (self._counterpart(first, preset) for preset in ("default", self.perturbation))
        config = SaliencyConfig(samples=self.samples, noise_seed=self.config.noise_seed)
        parts.append(
            "<p>captum <code>LayerGradCam</code> on the encoder's last convolution, signed "
            "(<code>relu_attributions=False</code>), upsampled bilinearly to the 84×96 frame the network sees (HUD cropped). "
            "It explains the newest frame; the older frames' tokens are held fixed. Targets: the predictive means of "
            "steer, gas and brake and the predictive steering std √(aleatoric + epistemic). "
            + "; ".join(f"<b>{t}</b>: {html.escape(TARGET_MEANINGS[t])}" for t in TARGETS)
            + f". Random draws of the head use one fixed seed ({self.config.noise_seed}) in every attributed pass, so each "
            "output is a deterministic function of the frame. Colour limits are symmetric per map (±max |attribution|).</p>")
        try:
            maps: dict[str, tuple[Drive, list[int], SaliencyInputs, GradCamMaps]] = {}
            for drive in (clean, perturbed):
                steps = sample_steps(len(drive.frames), self.config.frames)
                inputs = self._inputs(drive.frames, drive.arrays["speed"], steps)
                maps[drive.preset] = (drive, steps, inputs, grad_cam(self.model, inputs, config))
            _, _, clean_inputs, reference = maps[clean.preset]
            check = sanity_check(self.model, clean_inputs, reference, config, seed=self.config.noise_seed)
        except GradCamUnavailable as exc:
            return "\n".join(parts + [f'<p class="note">Grad-CAM is not shown for this run: {html.escape(str(exc))}.</p>'])
        arrays = {}
        for preset, (drive, steps, inputs, result) in maps.items():
            origin = "logged episode, re-driven and checked" if drive.logged else "not in the evaluation; driven for this report"
            figure = gradcam_figure(display_frames(inputs), result, steps, f"{drive.label} — {preset} ({origin})")
            path = save_figure(figure, self.out / "figures" / f"gradcam_{preset}.png")
            parts.append(f"<h3>{html.escape(preset)}: {html.escape(drive.label)}</h3><p class='small'>{origin}; steps "
                         f"{', '.join(map(str, steps))}.</p>" + self._image(path, f"Grad-CAM, {preset}"))
            arrays.update({f"{preset}_maps": result.maps, f"{preset}_coarse": result.coarse, f"{preset}_outputs": result.outputs,
                           f"{preset}_steps": np.array(steps)})
        data = self.out / "data" / "gradcam.npz"
        atomic_write_npz(data, {**arrays, "sanity_maps": check.maps})
        sanity = {"targets": list(TARGETS), "stages": check.stages, "spearman": check.spearman.tolist(),
                  "spearman_abs": check.spearman_abs.tolist(), "self_spearman": check.self_spearman.tolist()}
        atomic_write_json(self.out / "data" / "sanity.json", json_safe(sanity))
        figure = save_figure(sanity_figure(display_frames(clean_inputs), reference, check), self.out / "figures" / "sanity.png")
        rows = [{"stage": "trained (recomputed)", **dict(zip(TARGETS, check.self_spearman))}]
        rows += [{"stage": stage, **dict(zip(TARGETS, values))} for stage, values in zip(check.stages, check.spearman)]
        rows_abs = [{"stage": stage, **dict(zip(TARGETS, values))} for stage, values in zip(check.stages, check.spearman_abs)]
        parts += [
            "<h3>Sanity check: cascading randomisation</h3>",
            "<p>The encoder's weight layers are re-initialised one after another from the top (token projection first, "
            "then the convolutions down to the first; cumulative), and the maps of the clean frames recomputed. Spearman "
            "rank correlation with the trained model's maps, mean over frames (signed maps; then |maps|): it should fall "
            "towards 0 — maps that survive randomisation would show the image, not what the network learnt. "
            f"NaN: the map is constant (the target does not depend on the frame). Data: {self._link(data)}, "
            f"{self._link(self.out / 'data' / 'sanity.json')}.</p>",
            _table(rows, ("stage", *TARGETS)), _table(rows_abs, ("stage", *TARGETS)),
            self._image(figure, "sanity check"),
        ]
        return "\n".join(parts)

    def _inputs(self, frames: list[np.ndarray], speeds: np.ndarray, steps: list[int]) -> SaliencyInputs:
        length, stride = self.train_config.sequence_length, self.train_config.frame_stride
        offsets = sequence_offsets(length, stride)
        sequences = np.stack([np.stack([frames[i] for i in history_indices(step, offsets)]) for step in steps])
        speed = np.stack([speeds[history_indices(step, offsets)] for step in steps])
        return SaliencyInputs.from_sequences(sequences, sequence_timestamps(length, stride), speed)

    def _potentials_section(self) -> str:
        parts = ["<h2>4. Neuron-level potentials</h2>",
                 "<p>Recorded by hooks on the network while each episode is re-driven (the actions are checked against the "
                 "log), so every value comes from the forward pass that chose the step's action (batch 1, the newest "
                 "frame's query, means over heads and selected keys). Correlations (Pearson r, Spearman ρ) with the "
                 f"executed steering (+ right) and with the curvature {self.config.potentials.curvature_lookahead:g} world units "
                 f"ahead of the car (+ left); bands: left = steer &lt; −{self.config.potentials.steer_band:g}, straight = "
                 f"|steer| ≤ {self.config.potentials.steer_band:g}, right = steer &gt; {self.config.potentials.steer_band:g}.</p>"]
        for episode_id in self.chosen:
            drive = self._drive(episode_id)
            record = self.by_id[episode_id]
            title = f"{episode_id} ({record['model']})"
            potentials = episode_potentials(episode_id, title, drive.arrays, drive.recorder,
                                            env_track(record["colour_preset"], record["track_seed"]), self.config.potentials)
            parts.append(f"<h3>{html.escape(title)}</h3>")
            if potentials.kind == "none":
                parts.append(f'<p class="note">No circuit internals: {html.escape(potentials.reason)}.</p>')
                continue
            parts.append(self._potentials_block(potentials))
        return "\n".join(parts)

    def _potentials_block(self, potentials: EpisodePotentials) -> str:
        data = write_potential_data(potentials, self.out / "data")
        figures = self.out / "figures"
        stem = potentials.episode_id
        written = [save_figure(map_figure(potentials), figures / f"{stem}_potentials_map.png"),
                   save_figure(progress_figure(potentials), figures / f"{stem}_potentials_progress.png"),
                   save_figure(steering_figure(potentials), figures / f"{stem}_potentials_steer.png")]
        explanations = {"nsac": "NSAC: φ, κ, ψ, effective time τ, OU mean and std, attention (entropy, weight on the newest "
                                "frame and its std over draws, weights per frame slot) and the circuit's inter/command/motor "
                                "group means.",
                        "nac": "NAC: attention entropy (and weights per frame when every key is kept) and the circuit's "
                               "inter/command/motor group means; NAC has no OU parameters (φ, κ, ψ are NSAC's).",
                        "levy": "Lévy attention: evidence Λ, disagreement trΣ_V and deviation σ̂ of every action query."}
        rows = []
        for name, stat in potentials.statistics().items():
            row: dict[str, Any] = {"trace": name, "r(steer)": stat["steer"]["pearson"], "ρ(steer)": stat["steer"]["spearman"],
                                   "r(curvature)": stat["curvature_ahead"]["pearson"],
                                   "ρ(curvature)": stat["curvature_ahead"]["spearman"]}
            for band in BANDS:
                summary = stat["bands"][band]
                row[f"{band} (n={summary['n']})"] = f"{summary['mean']:.4g} ± {summary['std']:.4g}" if summary["n"] else "—"
            rows.append(row)
        captions = ("(a) along the driven path", "(b) against track progress", "(c) against steering and curvature ahead")
        return "\n".join([
            f"<p>{explanations[potentials.kind]} Data: {', '.join(self._link(p) for p in data)}.</p>",
            _table(rows, tuple(rows[0]) if rows else ()),
            *[self._image(path, caption) for path, caption in zip(written, captions)],
        ])

    # ------------------------------------------------------------------ HTML
    def _page(self, sections: list[str]) -> str:
        timing = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.timings.items())
        return "\n".join([
            "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            f"<title>nsacdrive report: {html.escape(self.eval_dir.name)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
            f"<h1>nsacdrive report: {html.escape(self.eval_dir.name)}</h1>",
            f"<p>Evaluation <code>{html.escape(str(self.eval_dir))}</code>, run <code>{html.escape(str(self.run_dir))}</code> "
            f"(model <b>{html.escape(self.train_config.model.model)}</b>, {self.train_config.sequence_length} frames "
            f"{self.train_config.frame_stride} steps apart), explained episodes: {html.escape(', '.join(self.chosen))}.</p>",
            *sections,
            f'<p class="small">Generated by <code>nsacdrive report</code> ({timing}). Static page: no script, '
            "no external resource; figures in <code>figures/</code>, data in <code>data/</code>.</p>",
            "</body>", "</html>", ""])

    def _image(self, path: Path, alt: str) -> str:
        relative = html.escape(path.relative_to(self.out).as_posix())
        return f'<p><img src="{relative}" alt="{html.escape(alt)}"></p>'

    def _link(self, path: Path) -> str:
        relative = html.escape(path.relative_to(self.out).as_posix())
        return f'<a href="{relative}">{html.escape(path.name)}</a>'


def sample_steps(total: int, count: int) -> list[int]:
    """``count`` steps evenly spaced over an episode, after the zoom-in intro when it is long enough."""
    start = INTRO_STEPS if total > INTRO_STEPS + count else 0
    return sorted(set(np.linspace(start, total - 1, count).round().astype(int).tolist()))


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "NaN" if not np.isfinite(value) else f"{value:.4g}"
    return str(value)


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """An HTML table of ``rows`` (text columns left-aligned, numbers to 4 significant digits)."""
    def cell(tag: str, value: Any) -> str:
        kind = ' class="text"' if isinstance(value, str) else ""
        return f"<{tag}{kind}>{html.escape(_format(value))}</{tag}>"

    head = "<tr>" + "".join(f'<th class="text">{html.escape(c)}</th>' for c in columns) + "</tr>"
    body = ["<tr>" + "".join(cell("td", row.get(c)) for c in columns) + "</tr>" for row in rows]
    return "<table>" + head + "".join(body) + "</table>"


def write_report(eval_dir: Path, out_dir: Path, config: ReportConfig = ReportConfig()) -> Path:
    """Write ``out_dir/index.html`` with its figures and data; returns the index path.

    ``out_dir`` must be new, empty or an earlier report (it holds ``index.html``); it changes only
    once the new report is complete."""
    out_dir = Path(out_dir)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "index.html").is_file():
        raise ValueError(f"{out_dir}: holds files but no report (index.html); write the report to a new or empty folder")
    for suffix in (PARTIAL_SUFFIX, STALE_SUFFIX):  # what a killed report left behind
        remove_abandoned_stages(out_dir.parent, f".{out_dir.name}", suffix)
    stage = out_dir.parent / f".{out_dir.name}.{os.getpid()}{PARTIAL_SUFFIX}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        Report(eval_dir, stage, config).write()
        replace_folder(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out_dir / "index.html"
