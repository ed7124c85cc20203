"""A protocol that cannot flatter the safety layer: monitors judged on shift families and tracks
that nothing was fitted on.

Shift *families* are the corruption families of :mod:`nsacdrive.envs.corruptions` (each driven at
a few severities) and colour presets (``random``). They are split into *development* families,
on which every choice is made, and *test* families, judged once; the headline is
**leave-one-family-out**: for each family, everything is fitted without it and judged on it.

What is fitted, and on what:

* **thresholds**: on clean laps of the *fitting* tracks (:func:`nsacdrive.eval.monitor.fit_threshold`,
  by default the conformal window threshold);
* **the learned failure predictor** (:mod:`nsacdrive.eval.failure_predictor`): on logs of
  *training* tracks, clean and under the development families;
* **the selected monitor**: among the candidates (every non-privileged score and the predictor),
  the one with the best F3 at ``selection_window_s`` on those same training-track logs;
* **the fallbacks' hand-back hold** (:func:`nsacdrive.eval.hand_back.choose_hold`): the longest
  candidate whose fallback, replayed on the selected monitor's scores, would have covered at most
  ``nominal_fallback_budget`` of the fitting tracks' nominal steps.

What is judged: the episodes of the *test* tracks under the held-out family (failures, alarms on
shifted-but-not-failing windows, frame AUROC), with the clean laps of the test tracks as the
nominal laps that false alarms are counted on. The conformal threshold's false-alarm rate is
checked on two track sets it was not fitted on (the test tracks' clean laps and the *check*
tracks' clean laps).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nsacdrive.envs.car_racing import FPS
from nsacdrive.envs.corruptions import NO_CORRUPTION
from nsacdrive.eval.cascade_cost import cascade_history, cascade_share
from nsacdrive.eval.failure_predictor import fit_predictor, with_predictor
from nsacdrive.eval.hand_back import choose_hold
from nsacdrive.eval.modes import parse_fallback
from nsacdrive.eval.monitor import (
    EpisodeScores,
    MonitorConfig,
    count_windows,
    episode_scores,
    fit_threshold,
    frame_metrics,
    nominal_windows,
)
from nsacdrive.eval.predictor_features import PREDICTOR_SCORE, PRIVILEGED_SCORES, FailurePredictor
from nsacdrive.eval.protocol_config import ProtocolConfig, ProtocolTracks
from nsacdrive.eval.results import load_log, load_records

#: the family of clean episodes (default colours, no corruption)
NOMINAL = "none"


def family_of(record: dict[str, Any]) -> str:
    """The shift family an episode was driven under: its corruption's family, its colour preset, or :data:`NOMINAL`."""
    corruption = record.get("corruption", NO_CORRUPTION)
    if corruption != NO_CORRUPTION:
        return corruption.rpartition("-")[0]
    return NOMINAL if record["colour_preset"] == "default" else record["colour_preset"]


@dataclass
class ProtocolData:
    """The scored episodes the protocol judges, each list keyed by family (:data:`NOMINAL` for clean laps)."""

    fit: list[EpisodeScores]  # clean laps of the fitting tracks: the thresholds
    check: list[EpisodeScores]  # clean laps of other tracks: the false-alarm guarantee's second check
    train: dict[str, list[EpisodeScores]]  # training tracks: the predictor and the selection
    test: dict[str, list[EpisodeScores]]  # test tracks: what is judged


def load_family_episodes(eval_dirs: Iterable[Path], config: MonitorConfig) -> dict[str, list[tuple[dict[str, Any], EpisodeScores]]]:
    """Every finished episode of the evaluations, its record and its scores, keyed by its shift family."""
    out: dict[str, list[tuple[dict[str, Any], EpisodeScores]]] = {}
    for eval_dir in eval_dirs:
        for record in load_records(eval_dir):
            if record["failed"]:
                continue
            arrays = load_log(eval_dir, record)
            out.setdefault(family_of(record), []).append((record, episode_scores(record, arrays, config)))
    return out


def load_family_scores(eval_dirs: Iterable[Path], config: MonitorConfig) -> dict[str, list[EpisodeScores]]:
    """Every finished episode of the evaluations, scored, keyed by its shift family."""
    return {family: [scores for _, scores in pairs] for family, pairs in load_family_episodes(eval_dirs, config).items()}


def candidate_scores(episodes: Sequence[EpisodeScores]) -> list[str]:
    """The scores a monitor in the car could use that every episode has, the predictor last."""
    names = set.intersection(*(set(e.scores) for e in episodes))
    ordered = [n for n in names if n not in PRIVILEGED_SCORES and n != PREDICTOR_SCORE]
    return sorted(ordered) + ([PREDICTOR_SCORE] if PREDICTOR_SCORE in names else [])


def _judge(episodes: list[EpisodeScores], name: str, threshold: float, config: MonitorConfig) -> dict[str, Any]:
    """Windows at every reaction time, frame metrics and the threshold of one score on ``episodes``."""
    return {"threshold": threshold, **frame_metrics(episodes, name, config.strata),
            "windows": {str(w): count_windows(episodes, name, threshold, w).to_dict() for w in config.windows_s}}


def judge_fold(data: ProtocolData, held_out: Sequence[str], config: ProtocolConfig) -> dict[str, Any]:
    """Fit on every family but ``held_out`` (predictor, thresholds, selection), judge on each held-out family."""
    development = [f for f in config.families if f not in held_out]
    train = [*data.train.get(NOMINAL, []), *itertools.chain.from_iterable(data.train.get(f, []) for f in development)]
    predictor = fit_predictor(train, config.predictor)
    train, fit = with_predictor(train, predictor), with_predictor(data.fit, predictor)
    nominal = with_predictor(data.test.get(NOMINAL, []), predictor)
    names = candidate_scores([*train, *fit, *nominal])
    thresholds = {name: fit_threshold(name, fit, config.monitor)[0] for name in names}
    window = config.selection_window_s
    selection = {name: count_windows(train, name, thresholds[name], window).f3 or 0.0 for name in names}
    selected = max(names, key=lambda name: selection[name])  # the first best in candidate order
    hold = choose_hold(train, fit, selected, thresholds[selected], config.hold_candidates_s, config.nominal_fallback_budget)
    families = {}
    for family in held_out:
        shifted = with_predictor(data.test.get(family, []), predictor)
        episodes = [*shifted, *nominal]
        families[family] = {"episodes": len(shifted), "failures": sum(len(e.events) for e in shifted),
                            "scores": {name: _judge(episodes, name, thresholds[name], config.monitor) for name in names}}
    return {"development": development, "selected": selected, "selection_f3": selection, "thresholds": thresholds,
            "hand_back": hold.to_dict(), "predictor": asdict(predictor), "families": families}


def false_alarm_check(data: ProtocolData, split: dict[str, Any]) -> dict[str, Any]:
    """Per score, with the fixed split's thresholds (fitted on the fitting tracks' clean laps) and
    predictor: the share of one-second windows that alarm on clean laps of the test tracks and of the
    check tracks (the target: at most ``false_alarm_rate``, with probability ``confidence`` for the
    conformal threshold)."""
    predictor = FailurePredictor.from_json(split["predictor"], "the split's predictor")
    track_sets = {"test tracks": with_predictor(data.test.get(NOMINAL, []), predictor), "check tracks": with_predictor(data.check, predictor)}
    out = {}
    for name, threshold in split["thresholds"].items():
        rates = {}
        for label, laps in track_sets.items():
            windows = [e.scores[name][a:b].max() > threshold for e in laps for a, b in nominal_windows(e, FPS)]
            rates[label] = {"windows": len(windows), "fpr": float(np.mean(windows)) if windows else None}
        out[name] = {"threshold": threshold, **rates}
    return out


def judge_protocol(data: ProtocolData, config: ProtocolConfig) -> dict[str, Any]:
    """The whole judgement: leave-one-family-out over every family, the fixed development/test split,
    and the false-alarm check."""
    split = judge_fold(data, list(config.test), config)
    return {"config": {**asdict(config), "monitor": {**asdict(config.monitor), "events": asdict(config.monitor.events)}},
            "episodes": {"fit": len(data.fit), "check": len(data.check),
                         "train": {f: len(v) for f, v in data.train.items()}, "test": {f: len(v) for f, v in data.test.items()}},
            "leave_one_family_out": {f: judge_fold(data, [f], config) for f in config.families},
            "split": split, "false_alarms": false_alarm_check(data, split)}


# --------------------------------------------------------------------------- summaries


def selected_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family, leave-one-family-out: the selected monitor and its figures at every window."""
    rows = []
    for family, fold in result["leave_one_family_out"].items():
        name = fold["selected"]
        judged = fold["families"][family]
        entry = judged["scores"][name]
        rows.append({"family": family, "development": family not in result["config"]["test"], "monitor": name,
                     "episodes": judged["episodes"], "failures": judged["failures"], "auroc": entry["auroc"],
                     "stratified_auroc": entry["stratified_auroc"], "windows": entry["windows"]})
    return rows


def _cell(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def to_terminal(result: dict[str, Any]) -> str:
    """Leave-one-family-out per family (under 100 columns): the monitor chosen without it, F3 at each
    window, the false-alarm rate on nominal laps of the test tracks and on its shifted windows."""
    windows = [str(w) for w in result["config"]["monitor"]["windows_s"]]
    head = f"{'family':<19}{'set':<5}{'monitor':<18}{'fail':>5}" + "".join(f"{f'F3 {w}s':>7}" for w in windows)
    lines = [head + f"{'FPR':>6}{'shift':>7}"]
    for row in selected_rows(result):
        first = row["windows"][windows[0]]
        lines.append(f"{row['family'][:18]:<19}{'dev' if row['development'] else 'test':<5}{row['monitor'][:17]:<18}"
                     f"{row['failures']:>5}" + "".join(f"{_cell(row['windows'][w]['f3'] if row['failures'] else None):>7}" for w in windows)
                     + f"{_cell(first['fpr']):>6}{_cell(first['fpr_shifted']):>7}")
    if result.get("fallbacks"):
        hold = result["split"]["hand_back"]
        chosen = next(c for c in hold["candidates"] if c["steps"] == hold["clear_steps"])
        lines.append("")
        lines.append(f"hand-back after {_cell(hold['hold_s'])} s clear, chosen on the development families: "
                     f"{_cell(chosen['nominal_share'], 3)} of the fitting tracks' nominal steps under it, "
                     f"{_cell(chosen['covered'])} of the last second before the training tracks' failures")
    for fallback, judged in result.get("fallbacks", {}).items():
        nominal = judged["nominal"]
        lines.append("")
        lines.append(f"fallback {fallback}{' (privileged: an upper bound)' if fallback == 'expert' else ''}: "
                     f"{_cell(nominal['fallback_fraction'], 3)} of clean steps under it, lap time ×{_cell(nominal['lap_time_ratio'], 3)}")
        if "cascade_compute" in judged:
            lines.append(f"the cascade ran at most {_cell(judged['cascade_compute'], 3)} of what running it every step costs")
        lines.append(f"{'family':<19}{'failures':>10}{'with':>6}{'prevented':>11}{'ended safely':>14}{'safe stops':>12}")
        for family, row in judged["families"].items():
            lines.append(f"{family[:18]:<19}{row['failures_without']:>10}{row['failures_with']:>6}{_cell(row['prevented']):>11}"
                         f"{_cell(row['ended_safely']):>14}{row['safe_stops']:>12}")
    alarms = result["false_alarms"]
    lines.append("")
    lines.append("false alarms on clean laps of tracks not fitted on (1 s windows): " + ", ".join(
        f"{name} {_cell(entry['test tracks']['fpr'])}/{_cell(entry['check tracks']['fpr'])}" for name, entry in alarms.items()))
    return "\n".join(lines)


# --------------------------------------------------------------------------- driving


def protocol_evaluations(run: str, tracks: ProtocolTracks, config: ProtocolConfig, **settings: Any) -> dict[str, Any]:
    """The closed-loop evaluations the protocol drives, by sub-folder name (``EvalConfig`` objects;
    ``settings``: ``drive``, ``batch``, ``workers``, ``backend``, ``inference``)."""
    from nsacdrive.eval.configs import EvalConfig

    corruptions, presets = config.corruptions(), config.colour_presets()
    evaluations = {"fit": EvalConfig(runs=(run,), seeds=tracks.fit, **settings),
                   "check": EvalConfig(runs=(run,), seeds=tracks.check, **settings)}
    for part in ("train", "test"):
        seeds = getattr(tracks, part)
        evaluations[f"{part}-corrupted"] = EvalConfig(runs=(run,), seeds=seeds, corruptions=(NO_CORRUPTION, *corruptions), **settings)
        if presets:
            evaluations[f"{part}-colours"] = EvalConfig(runs=(run,), seeds=seeds, colour_presets=tuple(presets), **settings)
    return evaluations


def drive_protocol(run: str, tracks: ProtocolTracks, config: ProtocolConfig, out: Path, resume: bool = False,
                   progress: bool = True, **settings: Any) -> ProtocolData:
    """Drive every evaluation of :func:`protocol_evaluations` into ``out/<part>`` (resumable) and score them."""
    from nsacdrive.eval.closed_loop import evaluate_closed_loop

    evaluations = protocol_evaluations(run, tracks, config, **settings)
    for name, evaluation in evaluations.items():
        folder = Path(out) / name
        evaluate_closed_loop(evaluation, folder, resume=resume and (folder / "episodes").exists(), progress=progress)
    return load_protocol_data(Path(out), config.monitor)


def fallback_label(fallback: str) -> str:
    """A fallback's name in folders and tables: ``cascade:RUN`` → ``cascade``."""
    return parse_fallback(fallback)[0]


def fallback_drive(drive: Any, split: dict[str, Any], config: ProtocolConfig, fallback: str) -> Any:
    """``drive`` watched by the split's selected monitor (fitted on the development families alone) with
    ``fallback`` (a name of :data:`~nsacdrive.eval.modes.FALLBACKS`, or ``cascade:RUN``), handing back
    after the hold chosen on those families."""
    from dataclasses import replace

    score = split["selected"]
    name, run = parse_fallback(fallback)
    predictor = FailurePredictor.from_json(split["predictor"], "protocol split predictor") if score == PREDICTOR_SCORE else None
    return replace(drive, monitor_score=score, monitor_threshold=float(split["thresholds"][score]),
                   monitor_smooth=config.monitor.smooth_steps, monitor_warmup=config.monitor.warmup_steps,
                   monitor_predictor=predictor, fallback=name, fallback_run=run, fallback_steps=int(split["hand_back"]["clear_steps"]))


def drive_fallbacks(run: str, tracks: ProtocolTracks, config: ProtocolConfig, split: dict[str, Any], fallbacks: Sequence[str],
                    out: Path, resume: bool = False, progress: bool = True, **settings: Any) -> None:
    """Drive the test tracks, clean and under every test family, with each fallback acting on the split's
    selected monitor, into ``out/guarded-FALLBACK-corrupted`` and ``out/guarded-FALLBACK-colours``
    (``settings`` as for :func:`protocol_evaluations`)."""
    from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop

    base = settings.pop("drive", DriveConfig())
    corruptions = [c for c in config.corruptions() if c.rpartition("-")[0] in config.test]
    parts = {"corrupted": {"corruptions": (NO_CORRUPTION, *corruptions)}}
    if presets := [p for p in config.colour_presets() if p in config.test]:
        parts["colours"] = {"colour_presets": tuple(presets)}
    for fallback in fallbacks:
        drive = fallback_drive(base, split, config, fallback)
        for part, conditions in parts.items():
            folder = Path(out) / f"guarded-{fallback_label(fallback)}-{part}"
            evaluation = EvalConfig(runs=(run,), seeds=tracks.test, drive=drive, **conditions, **settings)
            evaluate_closed_loop(evaluation, folder, resume=resume and (folder / "episodes").exists(), progress=progress)


def _events(pairs: list[tuple[dict[str, Any], EpisodeScores]]) -> int:
    return sum(len(scores.events) for _, scores in pairs)


def judge_fallbacks(out: Path, config: ProtocolConfig, fallbacks: Sequence[str]) -> dict[str, Any]:
    """Per fallback and test family: failures without and with it (the same tracks and conditions), the
    share prevented, the episodes that ended safely (a lap or a safe stop, without a failure), and on
    clean laps the share of steps under the fallback and the lap time against the unguarded laps."""
    unguarded = load_family_episodes(sorted(p for p in out.glob("test-*") if (p / "episodes").is_dir()), config.monitor)
    out_of = {}
    for spec in fallbacks:
        fallback = fallback_label(spec)
        guarded = load_family_episodes(sorted(p for p in out.glob(f"guarded-{fallback}-*") if (p / "episodes").is_dir()),
                                       config.monitor)
        families = {}
        for family in config.test:
            before, after = unguarded.get(family, []), guarded.get(family, [])
            safe = [(r["lap_finished"] or r["reason"] == "safe_stop") and not s.events for r, s in after]
            families[family] = {"episodes": len(after), "failures_without": _events(before), "failures_with": _events(after),
                                "prevented": 1 - _events(after) / _events(before) if _events(before) else None,
                                "ended_safely": float(np.mean(safe)) if safe else None,
                                "safe_stops": sum(r["reason"] == "safe_stop" for r, _ in after),
                                "laps": sum(bool(r["lap_finished"]) for r, _ in after)}
        clean_before, clean_after = unguarded.get(NOMINAL, []), guarded.get(NOMINAL, [])
        lap_steps = [np.mean([r["steps"] for r, _ in pairs if r["lap_finished"]] or [np.nan]) for pairs in (clean_before, clean_after)]
        out_of[fallback] = {"families": families, "nominal": {
            "episodes": len(clean_after), "fallback_fraction": float(np.mean([r["fallback_fraction"] for r, _ in clean_after]))
            if clean_after else None, "laps": sum(bool(r["lap_finished"]) for r, _ in clean_after),
            "lap_time_ratio": float(lap_steps[1] / lap_steps[0]) if np.isfinite(lap_steps).all() else None}}
        if fallback == "cascade":
            pairs = [pair for family in (NOMINAL, *config.test) for pair in guarded.get(family, [])]
            history = cascade_history(parse_fallback(spec)[1])
            out_of[fallback]["cascade_compute"] = cascade_share([record for record, _ in pairs], history)
    return out_of


def load_protocol_data(out: Path, config: MonitorConfig) -> ProtocolData:
    """The scored episodes of a driven protocol folder (``out/fit``, ``out/check``, ``out/train-*``, ``out/test-*``)."""
    def part(prefix: str) -> dict[str, list[EpisodeScores]]:
        return load_family_scores(sorted(p for p in out.glob(f"{prefix}-*") if (p / "episodes").is_dir()), config)

    return ProtocolData(fit=load_family_scores([out / "fit"], config).get(NOMINAL, []),
                        check=load_family_scores([out / "check"], config).get(NOMINAL, []),
                        train=part("train"), test=part("test"))
