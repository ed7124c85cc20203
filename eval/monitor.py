"""Misbehaviour prediction from closed-loop logs: does a score warn before the car fails?

The protocol of the Udacity-simulator line of work (SelfOracle, ICSE 2020; ThirdEye, ASE 2022;
Grewal, Tonella & Stocco, ICST 2024), on this project's per-step logs:

* **Failures** are the misbehaviour events of :mod:`nsacdrive.eval.misbehaviour` (off road,
  spinning, stalling, leaving the playfield).
* **Scores** (:data:`SCORES`) are computed per step from the log and smoothed by a trailing
  (causal) mean over ``smooth_steps`` — what a monitor running in the car could compute. The
  uncertainty scores sit beside baselines that use no uncertainty at all (predicted |steer|,
  speed, curvature of the road ahead), so a monitor that only detects corners is exposed.
* **Threshold**: the value that ``false_alarm_rate`` of the nominal windows of one second exceed
  (``threshold="window-rate"``, the default), or — ``threshold="gamma"`` — the ``quantile`` (0.95)
  of a Gamma distribution fitted (location 0, maximum likelihood) to the score on nominal driving,
  or — ``threshold="conformal"`` — the order statistic of the nominal windows' maxima that keeps a
  new nominal window's alarm probability at or below ``false_alarm_rate`` with probability
  ``confidence`` (:func:`conformal_rank`; the guarantee assumes the windows exchangeable, which
  windows of one track only approximately are: check it on other tracks).
* **Windows**: for a reaction window of W seconds, a failure (in any episode) is a true positive
  when the score exceeds the threshold at any step of the W seconds before its onset, else a false
  negative. Nominal driving (steps at least ``max(windows)`` seconds before any failure and
  outside failures, after the first ``warmup_steps`` of an episode) is cut into consecutive
  windows of W seconds; on *nominal laps* (episodes without corruption or colour shift, as the
  literature counts false alarms on nominal simulations) one with an alarm is a false positive,
  else a true negative. Precision, recall, FPR and F3 = TP / (TP + 0.1·FP + 0.9·FN) follow; the
  lead is the time from the first alarm inside the window to the onset. The nominal stretches of
  shifted episodes (corrupted or recoloured, not failing yet) are counted apart
  (``fp_shifted``, ``tn_shifted``, ``fpr_shifted``): how often the monitor alarms on an input
  shift that has not (yet) led to a failure.
* **Frames**: AUROC and AUPRC of the score with the steps of the second before each failure as
  positives and the nominal steps of nominal laps as negatives; ``stratified_auroc`` is their
  AUROC inside quantile bins of the road's curvature ahead, averaged with the bins' positive
  counts as weights, so a corner detector gets no credit for corners.

Nominal driving for the threshold is ``fit`` (other evaluations, typically clean laps), or the
nominal steps of the evaluated episodes without corruption or colour shift when none is given.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.controllers.metrics import average_precision, ood_auroc
from nsacdrive.envs.car_racing import FPS, env_track
from nsacdrive.envs.geometry import TrackGeometry
from nsacdrive.eval.configs import MonitorConfig  # torch-free there: the command line reads its defaults
from nsacdrive.eval.misbehaviour import Event, misbehaviour_events, true_runs
from nsacdrive.eval.monitor_scores import CURVATURE_DISTANCES, SCORES, score_inputs, smooth
from nsacdrive.eval.results import EvaluationError, clean_conditions, load_log, load_records

# --------------------------------------------------------------------------- scores


@dataclass
class EpisodeScores:
    """One episode's smoothed scores, its failures and which steps are nominal."""

    episode_id: str
    clean: bool  # no corruption and default colours
    events: list[Event]
    scores: dict[str, np.ndarray]  # name → [N] (NaN-free scores only)
    curvature: np.ndarray  # [N] |curvature ahead|, for the strata
    nominal: np.ndarray  # [N] bool
    warmup: int

    @property
    def steps(self) -> int:
        return len(self.nominal)


@functools.lru_cache(maxsize=256)
def track_geometry(colour_preset: str, track_seed: int) -> TrackGeometry:
    """The geometry of a seed's track, regenerated once per (preset, seed): many evaluations (one per
    corruption) drive the same tracks."""
    return TrackGeometry.from_env_track(env_track(colour_preset, track_seed))


def episode_scores(record: dict[str, Any], arrays: dict[str, np.ndarray], config: MonitorConfig) -> EpisodeScores:
    """Scores, failures and the nominal mask of one finished episode."""
    track = track_geometry(record["colour_preset"], record["track_seed"])
    ahead = track.curvature_ahead(np.asarray(arrays["progress"], dtype=np.float64), CURVATURE_DISTANCES)
    curvature = np.abs(ahead).max(1)
    arrays = {**arrays, "curvature": curvature}
    scores = {}
    for name, (_, _, compute) in SCORES.items():
        if any(key not in arrays for key in score_inputs(name)):  # logs written before the field existed
            continue
        values = np.asarray(compute(arrays), dtype=np.float64)
        if values.shape == (len(curvature),) and np.all(np.isfinite(values)):
            scores[name] = smooth(values, config.smooth_steps)
    events = misbehaviour_events(arrays, record["reason"], config.events)
    n = len(curvature)
    nominal = np.ones(n, dtype=bool)
    nominal[: config.warmup_steps] = False
    margin = max(config.windows_s) * FPS
    for event in events:
        nominal[max(event.onset - margin, 0): event.end] = False
    return EpisodeScores(record["episode_id"], clean_conditions(record), events, scores, curvature, nominal, config.warmup_steps)


def load_scores(eval_dirs: Sequence[Path], config: MonitorConfig) -> tuple[list[EpisodeScores], list[str]]:
    """Every finished episode of the evaluations; and the ids of episodes without a log (failed runs)."""
    out, skipped = [], []
    for eval_dir in eval_dirs:
        for record in load_records(eval_dir):
            if record["failed"]:
                skipped.append(record["episode_id"])
                continue
            arrays = load_log(eval_dir, record)
            out.append(episode_scores(record, arrays, config))
    return out, skipped


# --------------------------------------------------------------------------- thresholds


def gamma_threshold(values: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of a Gamma(shape, scale) fitted by maximum likelihood to ``values`` (location 0)."""
    from scipy import stats

    positive = np.asarray(values, dtype=np.float64)
    positive = positive[np.isfinite(positive)]
    if positive.size < 2 or np.ptp(positive) == 0:
        raise ValueError(f"a Gamma fit needs at least 2 distinct finite values, got {positive.size}")
    positive = np.maximum(positive, np.finfo(np.float64).tiny * 1e10)  # the Gamma lives on (0, ∞)
    shape, _, scale = stats.gamma.fit(positive, floc=0.0)
    return float(stats.gamma.ppf(quantile, shape, loc=0.0, scale=scale))


def window_rate_threshold(window_maxima: np.ndarray, rate: float) -> float:
    """The value exceeded by the maximum of a fraction ``rate`` of nominal windows."""
    return float(np.quantile(window_maxima, 1.0 - rate))


def conformal_rank(windows: int, rate: float, confidence: float) -> int:
    """The smallest rank k (1-based) such that the k-th smallest of ``windows`` nominal window maxima,
    used as the threshold, is exceeded by a new nominal window with probability at most ``rate``, with
    probability at least ``confidence`` over the calibration windows.

    For exchangeable, continuous scores the exceedance probability of the k-th order statistic is
    1 − U₍ₖ₎ with U₍ₖ₎ ~ Beta(k, n + 1 − k), so P(exceedance > rate) = BetaCDF(1 − rate; k, n + 1 − k),
    which falls with k: the smallest k that brings it to ``1 − confidence`` or below is the tightest
    threshold with the guarantee (Vovk's training-conditional split conformal). Raises ValueError
    when even the largest window maximum cannot give it (too few windows)."""
    from scipy import stats

    ranks = np.arange(1, windows + 1)
    failing = stats.beta.cdf(1.0 - rate, ranks, windows + 1 - ranks)
    allowed = np.flatnonzero(failing <= 1.0 - confidence)
    if allowed.size == 0:
        needed = int(np.ceil(np.log(1.0 - confidence) / np.log(1.0 - rate)))
        raise ValueError(f"a conformal threshold with false-alarm rate {rate} at confidence {confidence} needs at least "
                         f"{needed} nominal windows of one second, got {windows}; drive more nominal laps (or lower --confidence)")
    return int(ranks[allowed[0]])


def conformal_threshold(window_maxima: np.ndarray, rate: float, confidence: float) -> float:
    """The :func:`conformal_rank`-th smallest nominal window maximum (the finite-sample corrected threshold)."""
    ordered = np.sort(np.asarray(window_maxima, dtype=np.float64))
    return float(ordered[conformal_rank(ordered.size, rate, confidence) - 1])


def nominal_windows(episode: EpisodeScores, length: int) -> list[tuple[int, int]]:
    """Consecutive windows of ``length`` steps inside each nominal stretch (a last partial one is dropped)."""
    return [(s, s + length) for start, stop in true_runs(episode.nominal) for s in range(start, stop - length + 1, length)]


def fit_threshold(name: str, nominal: list[EpisodeScores], config: MonitorConfig) -> tuple[float, str]:
    """The alarm threshold of score ``name`` on nominal episodes, and how it was set: ``config.threshold``,
    or ``max`` for a score that is constant on nominal driving (e.g. the epistemic part of a single
    Gaussian head), which then alarms only above everything seen there."""
    if config.threshold == "gamma":
        values = np.concatenate([e.scores[name][e.nominal] for e in nominal])
        if np.ptp(values) == 0:
            return float(values.max()), "max"
        return gamma_threshold(values, config.quantile), "gamma"
    maxima = np.array([e.scores[name][a:b].max() for e in nominal for a, b in nominal_windows(e, FPS)])
    if maxima.size == 0:
        raise ValueError(f"{name}: no nominal window of one second to set the threshold on")
    if config.threshold == "conformal":
        return conformal_threshold(maxima, config.false_alarm_rate, config.confidence), "conformal"
    return window_rate_threshold(maxima, config.false_alarm_rate), "window-rate"


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class WindowCounts:
    """Failures and nominal windows judged at one reaction window (see the module docstring)."""

    tp: int
    fp: int
    fn: int
    tn: int
    leads_s: tuple[float, ...]
    fp_shifted: int = 0
    tn_shifted: int = 0

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def fpr(self) -> float | None:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else None

    @property
    def f3(self) -> float | None:
        """TP / (TP + 0.1·FP + 0.9·FN), the F-score with β = 3 (recall 9× as important as precision)."""
        denominator = self.tp + 0.1 * self.fp + 0.9 * self.fn
        return self.tp / denominator if denominator else None

    def to_dict(self) -> dict[str, Any]:
        shifted = self.fp_shifted + self.tn_shifted
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn, "precision": self.precision, "recall": self.recall,
                "fpr": self.fpr, "f3": self.f3, "median_lead_s": float(np.median(self.leads_s)) if self.leads_s else None,
                "fp_shifted": self.fp_shifted, "tn_shifted": self.tn_shifted,
                "fpr_shifted": self.fp_shifted / shifted if shifted else None}


def pre_failure_window(episode: EpisodeScores, index: int, length: int) -> tuple[int, int]:
    """Steps [start, onset) of the ``length`` steps before failure ``index``: after the warm-up and the previous failure."""
    event = episode.events[index]
    previous_end = episode.events[index - 1].end if index else 0
    return max(event.onset - length, episode.warmup, previous_end), event.onset


def count_windows(episodes: list[EpisodeScores], name: str, threshold: float, seconds: int) -> WindowCounts:
    """TP/FN over failures, FP/TN over the nominal windows of ``seconds`` of nominal laps (and apart, of shifted episodes)."""
    length = seconds * FPS
    tp = fn = 0
    alarms_in_windows = {True: [0, 0], False: [0, 0]}  # clean? → [fp, tn]
    leads = []
    for episode in episodes:
        score = episode.scores[name]
        for index in range(len(episode.events)):
            start, onset = pre_failure_window(episode, index, length)
            if start >= onset:
                continue  # a failure during the warm-up or right after another: nothing to predict it from
            alarms = np.flatnonzero(score[start:onset] > threshold)
            if alarms.size:
                tp += 1
                leads.append((onset - start - alarms[0]) / FPS)
            else:
                fn += 1
        for a, b in nominal_windows(episode, length):
            alarms_in_windows[episode.clean][0 if np.any(score[a:b] > threshold) else 1] += 1
    (fp, tn), (fp_shifted, tn_shifted) = alarms_in_windows[True], alarms_in_windows[False]
    return WindowCounts(tp, fp, fn, tn, tuple(leads), fp_shifted, tn_shifted)


def frame_labels(episode: EpisodeScores) -> np.ndarray:
    """Per step: 1 in the second before a failure, 0 nominal on a nominal lap, −1 neither (left out of frame metrics)."""
    labels = np.where(episode.nominal & episode.clean, 0, -1)
    for index in range(len(episode.events)):
        start, onset = pre_failure_window(episode, index, FPS)
        labels[start:onset] = 1
    return labels


def frame_metrics(episodes: list[EpisodeScores], name: str, strata: int) -> dict[str, Any]:
    """Frame-level AUROC and AUPRC, and the curvature-stratified AUROC with its per-bin values."""
    labels = np.concatenate([frame_labels(e) for e in episodes])
    score = np.concatenate([e.scores[name] for e in episodes])
    curvature = np.concatenate([e.curvature for e in episodes])
    used = labels >= 0
    labels, score, curvature = labels[used], score[used], curvature[used]
    if not (labels == 1).any() or not (labels == 0).any():
        return {"auroc": None, "auprc": None, "stratified_auroc": None, "strata": []}
    edges = np.quantile(curvature, np.linspace(0, 1, strata + 1))
    bins = np.clip(np.searchsorted(edges, curvature, side="right") - 1, 0, strata - 1)
    per_bin = []
    for b in range(strata):
        inside = bins == b
        positives, negatives = score[inside & (labels == 1)], score[inside & (labels == 0)]
        auroc = ood_auroc(negatives, positives) if positives.size and negatives.size else None
        per_bin.append({"curvature": [float(edges[b]), float(edges[b + 1])], "positives": int(positives.size),
                        "negatives": int(negatives.size), "auroc": auroc})
    weighted = [(s["auroc"], s["positives"]) for s in per_bin if s["auroc"] is not None]
    stratified = float(np.average([a for a, _ in weighted], weights=[w for _, w in weighted])) if weighted else None
    return {"auroc": ood_auroc(score[labels == 0], score[labels == 1]),
            "auprc": average_precision(score[labels == 0], score[labels == 1]),
            "stratified_auroc": stratified, "strata": per_bin}


def evaluate_monitors(episodes: list[EpisodeScores], nominal: list[EpisodeScores], config: MonitorConfig) -> dict[str, Any]:
    """``{"scores": {NAME: {...}}, ...}``: every score the episodes all have (see :func:`run_monitor`)."""
    names = [n for n in SCORES if all(n in e.scores for e in (*episodes, *nominal))]
    scores = {}
    for name in names:
        threshold, method = fit_threshold(name, nominal, config)
        entry: dict[str, Any] = {"description": SCORES[name][0], "uses_uncertainty": SCORES[name][1], "threshold": threshold,
                                 "threshold_method": method}
        entry.update(frame_metrics(episodes, name, config.strata))
        entry["windows"] = {str(w): count_windows(episodes, name, threshold, w).to_dict() for w in config.windows_s}
        scores[name] = entry
    return scores


def run_monitor(eval_dirs: Sequence[Path], fit_dirs: Sequence[Path] = (),
                config: MonitorConfig = MonitorConfig()) -> tuple[dict[str, Any], list[EpisodeScores]]:
    """The whole ``monitor.json`` (settings, failures found, every score's results) and the evaluated episodes."""
    episodes, skipped = load_scores(eval_dirs, config)
    if not episodes:
        raise EvaluationError(f"{', '.join(map(str, eval_dirs))}: no finished episode with a per-step log")
    if fit_dirs:
        nominal, _ = load_scores(fit_dirs, config)
        source = [str(d) for d in fit_dirs]
    else:
        nominal = [e for e in episodes if e.clean]
        source = "the clean episodes of the evaluations"
    if not nominal or not any(e.nominal.any() for e in nominal):
        raise EvaluationError("no nominal driving to fit the thresholds on: pass --fit with an evaluation of clean laps")
    failures = [{"episode": e.episode_id, "onset_s": ev.onset / FPS, "end_s": ev.end / FPS, "kind": ev.kind}
                for e in episodes for ev in e.events]
    result = {
        "config": {**asdict(config), "events": asdict(config.events)},
        "evaluations": [str(d) for d in eval_dirs],
        "fit": source,
        "episodes": len(episodes),
        "episodes_without_log": skipped,
        "nominal_episodes": len(nominal),
        "failures": failures,
        "outcomes": outcomes(eval_dirs),
        "scores": evaluate_monitors(episodes, nominal, config),
    }
    return result, episodes


#: what :func:`outcomes` keeps of each aggregate row of an evaluation
OUTCOME_FIELDS = ("run", "model", "colour_preset", "corruption", "episodes", "faults", "laps", "safe_stops", "off_road_events",
                  "alarms_per_episode", "fallback_fraction")


def outcomes(eval_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Per evaluation, controller and condition: episodes, faults, laps finished, safe stops, off-road
    events, alarms per episode and the share of steps under the fallback (what the monitor's alarms led
    to); numbers that do not exist (no episode driven to its end) are None."""
    from nsacdrive.common.atomic import json_safe
    from nsacdrive.eval.closed_loop import aggregate

    return json_safe([{"evaluation": str(eval_dir), **{name: row[name] for name in OUTCOME_FIELDS}}
                      for eval_dir in eval_dirs for row in aggregate(load_records(eval_dir))])


# --------------------------------------------------------------------------- output


def _cell(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def to_markdown(result: dict[str, Any]) -> str:
    """One row per score: threshold, frame-level AUROC/AUPRC, stratified AUROC, then per window P/R/FPR/F3/lead."""
    windows = [str(w) for w in result["config"]["windows_s"]]
    columns = ["score", "uncertainty", "threshold", "AUROC", "AUPRC", "curv.-strat. AUROC"]
    columns += [f"{w} s: {m}" for w in windows for m in ("TP/FN/FP/TN", "precision", "recall", "FPR", "F3", "lead s")]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, entry in result["scores"].items():
        cells = [name, "yes" if entry["uses_uncertainty"] else "no", f"{entry['threshold']:.4g}", _cell(entry["auroc"]),
                 _cell(entry["auprc"]), _cell(entry["stratified_auroc"])]
        for w in windows:
            c = entry["windows"][w]
            cells += [f"{c['tp']}/{c['fn']}/{c['fp']}/{c['tn']}", _cell(c["precision"]), _cell(c["recall"]), _cell(c["fpr"]),
                      _cell(c["f3"]), _cell(c["median_lead_s"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _failures_line(result)


def _failures_line(result: dict[str, Any]) -> str:
    """The failures found by kind, and what the thresholds were fitted on."""
    kinds: dict[str, int] = {}
    for failure in result["failures"]:
        kinds[failure["kind"]] = kinds.get(failure["kind"], 0) + 1
    return (f"{len(result['failures'])} failures ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'none'}) in "
            f"{result['episodes']} episodes; thresholds: {result['config']['threshold']} on {result['nominal_episodes']} nominal "
            f"episodes ({result['fit'] if isinstance(result['fit'], str) else ', '.join(result['fit'])})")


def to_terminal(result: dict[str, Any]) -> str:
    """The table a terminal shows (under 100 columns): per score the frame AUROC and, at the shortest
    reaction window, F3, FPR and the median lead; ``monitor.md`` holds every column."""
    window = str(min(result["config"]["windows_s"]))
    lines = [f"{'score':<20}{'threshold':>10}{'AUROC':>7}{'strat.':>8}{f'{window} s: F3':>10}{'FPR':>6}{'recall':>8}{'lead s':>8}"]
    for name, entry in result["scores"].items():
        c = entry["windows"][window]
        lines.append(f"{name[:20]:<20}{entry['threshold']:>10.4g}{_cell(entry['auroc']):>7}{_cell(entry['stratified_auroc']):>8}"
                     f"{_cell(c['f3']):>10}{_cell(c['fpr']):>6}{_cell(c['recall']):>8}{_cell(c['median_lead_s'], 1):>8}")
    return "\n".join(lines) + "\n\n" + _failures_line(result)


#: Scores drawn in the trace figure when present: the model's own, the density, and the best-known baseline.
TRACE_SCORES = ["steer_std", "density", "abs_steer", "curvature"]


def write_monitor(result: dict[str, Any], episodes: list[EpisodeScores], out: Path) -> str:
    """``monitor.json``, ``monitor.md``, ``figures/window-Ns.png`` and ``figures/traces.png`` in ``out``; returns the table."""
    from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
    from nsacdrive.common.figures import save_figure
    from nsacdrive.common.versions import write_versions
    from nsacdrive.eval.plots import monitor_traces_figure, monitor_window_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(result)
    atomic_write_json(out / "monitor.json", result)
    atomic_write_bytes(out / "monitor.md", (markdown + "\n").encode())
    for window in result["scores"][next(iter(result["scores"]))]["windows"] if result["scores"] else ():
        save_figure(monitor_window_figure(result, window), out / "figures" / f"window-{window}s.png")
    traces = monitor_traces_figure(episodes, result, [n for n in TRACE_SCORES if n in result["scores"]])
    if traces is not None:
        save_figure(traces, out / "figures" / "traces.png")
    write_versions(out)
    return markdown
