"""bench.model_costs: models under one recipe, timed against a baseline."""

from __future__ import annotations

import dataclasses

import pytest

from bench.common import recipe
from bench.model_costs import Candidate, epochs_scale, main, optimiser_steps, recipe_ratio, whole_training


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


def test_a_whole_training_runs_the_share_of_the_recipes_epochs_into_a_fresh_folder(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("bench.model_costs.subprocess.run", lambda command, **kwargs: calls.append(command))
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "left-over").write_text("from the run before")
    whole_training(Candidate.parse("configs/quality.json:gmle"), "data/quality", 1 / 15, folder)()
    command = calls[0]
    assert command[command.index("--model") + 1] == "gmle" and command[command.index("--epochs") + 1] == "2"
    assert command[command.index("--config") + 1] == "configs/quality.json" and not folder.exists()


def test_whole_trainings_that_round_to_other_shares_are_scaled_back_to_the_recipes():
    base = recipe("configs/quality.json", "nsac")  # 30 epochs: 2 at a share of 1/15
    shorter = dataclasses.replace(base, epochs=25)  # 1.67 rounds to 2: a larger share of its recipe
    assert epochs_scale(base, base, 1 / 15) == 1
    assert epochs_scale(shorter, base, 1 / 15) == pytest.approx((25 / 2) / (30 / 2))


def test_the_bench_prints_whole_trainings_scaled_to_the_recipes(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr("bench.model_costs.subprocess.run", lambda command, **kwargs: calls.append(command))
    main(["configs/quality.json:nsac", "configs/quality.json:gmle", "--pairs", "1", "--control-pairs", "1",
          "--whole-data", "data/quality", "--whole-pairs", "1"])
    assert "whole trainings:" in capsys.readouterr().out.splitlines()[-1]
    assert [command[command.index("--model") + 1] for command in calls] == ["nsac", "gmle"]


def test_a_share_of_no_epochs_is_refused():
    with pytest.raises(SystemExit):
        main(["configs/quality.json:nsac", "configs/quality.json:gmle", "--whole-share", "0"])
