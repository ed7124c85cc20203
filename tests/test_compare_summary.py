"""bench/compare_summary.py: which corruptions count as harmful and what each column averages."""

from __future__ import annotations

import numpy as np
import pytest

from bench.compare_summary import HARM_RATIO, harmful, severity, summarise, to_markdown


def condition(mse: float, error_auroc: float, spearman: float = 0.5, crps: float = 0.02) -> dict:
    steer = {"mse": mse, "crps": crps, "crps_lo": crps * 0.8, "crps_hi": crps * 1.2, "mace": 0.1, "ause": 0.01,
             "error_auroc": error_auroc, "spearman": spearman}
    return {"per_action": {"steer": steer}, "per_action_calibrated": {"steer": {"nll": -1.0, "mace": 0.04, "mace_isotonic": 0.02,
                                                                                "coverage_90": 0.9}}}


def run(model: str, clean_mse: float, tilt_auroc: float) -> dict:
    return {
        "model": model,
        "conditions": {
            "clean": condition(clean_mse, 0.9),
            "fog-3": condition(clean_mse * 1.2, 0.7),                          # harmless: below ×2
            "camera-tilt-1": condition(clean_mse * HARM_RATIO, 0.6, crps=0.04),  # harmful, but below the OOD severity
            "camera-tilt-3": condition(clean_mse * 3, tilt_auroc, spearman=-0.2, crps=0.06),
            "shift-3": condition(clean_mse * 5, 0.5),                           # a colour preset, not a corruption
        },
        "ood_auroc_conditions": {c: {"components": {"total": {"steer": 0.6}, "epistemic": {"steer": 0.7}, "density": d}}
                                 for c, d in (("fog-3", 0.5), ("camera-tilt-1", 0.55), ("camera-tilt-3", 0.95), ("shift-3", 0.5))},
    }


def test_severity_reads_corruptions_only():
    assert severity("camera-tilt-3") == 3 and severity("lens-dirt-5") == 5
    assert severity("clean") is None and severity("shift-3") is None and severity("random") is None


def test_harmful_conditions_are_corruptions_that_at_least_double_the_clean_mse():
    assert harmful(run("nsac", 0.01, 0.3), "steer") == ["camera-tilt-1", "camera-tilt-3"]


def test_columns_average_per_run_then_over_seeds():
    rows = summarise([run("nsac", 0.01, 0.3), run("nsac", 0.02, 0.5), run("gmle", 0.01, 0.9)])
    assert [r["model"] for r in rows] == ["nsac", "gmle"] and rows[0]["seeds"] == 2
    nsac = rows[0]
    assert nsac["MSE"][0] == pytest.approx(0.015) and nsac["MSE"][1] == pytest.approx(0.005)
    # per run: the mean of tilt-1's 0.6 and tilt-3's AUROC; then over the seeds
    assert nsac["error AUROC harmful"][0] == pytest.approx(np.mean([(0.6 + 0.3) / 2, (0.6 + 0.5) / 2]))
    assert nsac["worst error AUROC harmful"][2] == pytest.approx([0.3, 0.5])
    assert nsac["Spearman harmful"][0] == pytest.approx((0.5 - 0.2) / 2)
    assert nsac["OOD density"][0] == pytest.approx(0.95)  # severity ≥ 3 only
    assert nsac["CRPS suite"][0] == pytest.approx(np.mean([0.02, 0.04, 0.06]))  # the corruptions, not shift-3
    assert nsac["harmful"][0] == 2 and nsac["interval"] == "[0.0160, 0.0240]"
    table = to_markdown(rows)
    assert table.splitlines()[0].count("|") == table.splitlines()[2].count("|")
    assert "| gmle | 1 | 0.0100 ± 0.0000 |" in table


def test_a_rank_statistic_of_a_constant_sigma_is_left_out_not_averaged():
    constant = run("nac", 0.01, 0.5)
    for report in constant["conditions"].values():
        report["per_action"]["steer"]["spearman"] = float("nan")
    (row,) = summarise([constant])
    assert row["Spearman harmful"] is None and "nan" not in to_markdown([row])


def test_a_cell_says_how_many_seeds_it_averages_when_some_have_no_value():
    mild = run("levy", 0.01, 0.5)
    for name in ("camera-tilt-1", "camera-tilt-3"):
        mild["conditions"][name]["per_action"]["steer"]["mse"] = 0.011  # nothing doubles the clean MSE
    table = to_markdown(summarise([mild, run("levy", 0.01, 0.5)]))
    assert "0.55 ± 0.00 (1 of 2 seeds)" in table  # the error AUROC over the harmful conditions: one seed has them
