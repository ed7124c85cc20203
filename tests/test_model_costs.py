"""bench.model_costs: models under one recipe, timed against a baseline."""

from __future__ import annotations

import dataclasses

import pytest

from bench.common import recipe
from bench.model_costs import Candidate, main, optimiser_steps, recipe_ratio


def test_a_model_under_a_recipe_keeps_the_recipe_and_changes_only_the_model():
    quality, gmle = recipe("configs/quality.json"), Candidate.parse("configs/quality.json:gmle").config
    assert gmle.model.model == "gmle"
    assert dataclasses.replace(gmle.model, model=quality.model.model) == quality.model
    assert dataclasses.replace(gmle, model=quality.model) == quality


def test_a_missing_recipe_is_named():
    with pytest.raises(SystemExit, match="configs/nope.json:gmle: configs/nope.json is not a recipe file"):
        Candidate.parse("configs/nope.json:gmle")


def test_the_bench_times_each_candidate_against_the_baseline(capsys):
    main(["configs/quality.json:nsac", "configs/quality.json:gmle", "--pairs", "1", "--control-pairs", "1"])
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "configs/quality.json:gmle" and row[2].endswith("×") and row[3].startswith("×") and row[5].endswith("×")


def test_the_whole_recipe_scales_the_step_by_the_recipes_optimiser_steps():
    base = recipe("configs/quality.json", "nsac")
    shorter = dataclasses.replace(base, epochs=base.epochs // 2)
    assert optimiser_steps(base) == base.epochs * base.max_batches_per_epoch
    assert recipe_ratio(1.6, shorter, base) == pytest.approx(1.6 * (base.epochs // 2) / base.epochs)
    assert recipe_ratio(1.6, dataclasses.replace(base, max_batches_per_epoch=None), base) is None
