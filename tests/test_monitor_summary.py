"""bench/monitor_summary.py: per-seed figures of monitor.json, then mean ± std over the seeds."""

from __future__ import annotations

import json

import pytest

from bench.monitor_summary import parse_groups, side_by_side, summarise


def entry(auroc: float, f3: float | None, lead: float | None = 1.5, uses: bool = True) -> dict:
    windows = {str(w): {"f3": f3, "fpr": 0.04, "recall": 0.9, "precision": 0.8, "median_lead_s": lead if w == 3 else 0.5,
                        "fpr_shifted": 0.2} for w in (1, 2, 3)}
    return {"uses_uncertainty": uses, "auroc": auroc, "auprc": 0.5, "stratified_auroc": auroc - 0.1, "windows": windows}


def monitor(failures: int, auroc: float, f3: float | None, extra: bool = False) -> dict:
    scores = {"steer_std": entry(auroc, f3), "abs_steer": entry(0.8, 0.2, uses=False)}
    if extra:
        scores["density"] = entry(0.99, 0.96)
    return {"config": {"windows_s": [1, 2, 3]}, "failures": [{}] * failures, "scores": scores}


def test_each_figure_is_the_mean_and_std_of_the_seeds_figures():
    summary = summarise([monitor(40, 0.9, 0.9, extra=True), monitor(46, 0.94, 1.0), monitor(34, 0.98, None)], seconds=1)
    assert summary["failures"] == [40, 46, 34]
    assert set(summary["scores"]) == {"steer_std", "abs_steer"}  # density: only one seed has it
    row = summary["scores"]["steer_std"]
    assert row["frame AUROC"][0] == pytest.approx(0.94) and row["frame AUROC"][2] == 3
    assert row["frame AUROC"][1] == pytest.approx((0.0032 / 3) ** 0.5)  # ddof 0: deviations −0.04, 0, +0.04
    assert row["curvature-stratified AUROC"][0] == pytest.approx(0.84)
    assert row["F3"][:1] == (pytest.approx(0.95),) and row["F3"][2] == 2  # undefined for one seed, left out
    assert row["lead s (longest window)"][0] == pytest.approx(1.5)  # read from the 3 s window, not the 1 s one


def test_side_by_side_lists_the_scores_both_models_have(tmp_path):
    a = {"seeds": 1, "failures": [1], "scores": summarise([monitor(1, 0.9, 0.9, extra=True)], 1)["scores"]}
    b = {"seeds": 1, "failures": [1], "scores": summarise([monitor(1, 0.8, 0.5)], 1)["scores"]}
    table = side_by_side({"nsac": a, "ensemble": b})
    assert "density" not in table and "| steer_std | 0.90 ± 0.00 / 0.04 ± 0.00 / 0.90 ± 0.00 / 0.80 ± 0.00 |" in table


def test_groups_need_a_label_and_folders_with_monitor_json(tmp_path):
    (tmp_path / "m0").mkdir()
    (tmp_path / "m0" / "monitor.json").write_text(json.dumps(monitor(1, 0.9, 0.9)))
    assert parse_groups([f"nsac={tmp_path / 'm0'}"]) == {"nsac": [tmp_path / "m0"]}
    with pytest.raises(ValueError, match="LABEL=DIR"):
        parse_groups([str(tmp_path / "m0")])
    with pytest.raises(FileNotFoundError, match="m1: no monitor.json"):
        parse_groups([f"nsac={tmp_path / 'm1'}"])
