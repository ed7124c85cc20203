"""The teacher-students study: its steps follow make demo with the teacher everywhere, and its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.seed_table import Row, recipe_and_seed
from bench.teacher_students import RECIPES, commands_for, laps_cell, student_runs, teacher_name

DEMO, FRONT = RECIPES["carracing"], RECIPES["front"]


def test_teacher_names_make_folder_names():
    assert teacher_name("expert") == "expert"
    assert teacher_name("ppo:runs/ppo/state-s0/best") == "ppo_runs_ppo_state_s0_best"


def test_the_teacher_records_the_demonstrations_and_labels_the_dagger_round():
    steps = commands_for("ppo:P", DEMO, Path("data/t"), Path("runs/t"), [0, 1], workers=2)
    collects = [s for s in steps if s[1] == "collect"]
    assert len(collects) == 3 and all(s[s.index("--agent") + 1] == "ppo:P" for s in collects)
    daggers = [s for s in steps if s[1] == "dagger"]
    assert [s[s.index("--init") + 1] for s in daggers] == ["runs/t/nsac-s0", "runs/t/nsac-s1"]
    assert all(s[s.index("--expert") + 1] == "ppo:P" for s in daggers)
    evaluations = [s for s in steps if s[1] == "eval"]
    assert "runs/t/nsac-s0" in evaluations[0] and "runs/t/nsac-s1" in evaluations[0]
    assert [e[2] for e in evaluations[1:]] == ["runs/t/dagger-s0/runs/round-1", "runs/t/dagger-s1/runs/round-1"]
    assert len({e[e.index("--out") + 1] for e in evaluations}) == 3  # no evaluation holds two runs called round-1


@pytest.mark.parametrize("recipe", [DEMO, FRONT])
def test_each_stage_is_one_recipe_across_training_seeds(recipe):
    for runs in student_runs(Path("runs") / teacher_name("ppo:runs/ppo/state-s3"), recipe, [0, 1]).values():
        assert recipe_and_seed(str(runs[0])) == (recipe_and_seed(str(runs[1]))[0], "0")


def test_a_cell_gives_laps_per_training_seed_and_their_spread():
    run = student_runs(Path("runs/t"), DEMO, [0, 1])["second"][0]
    recipe = recipe_and_seed(str(run))[0]
    rows = [Row(recipe, "default", "", ("0", "1"), (1.0, 0.5), (2, 2), (900.0, 500.0), (1.0, 1.0))]
    assert laps_cell(rows, run, "default", [0, 1]) == "2 / 1 of 2 (75 ± 35 %)"
    assert laps_cell(rows, run, "shift-3", [0, 1]) == "– / –"
    uneven = [Row(recipe, "default", "", ("1",), (1 / 3,), (3,), (0.0,), (1.0,))]
    assert laps_cell(uneven, run, "default", [0, 1]) == "– / 1 of 3 (33 %)"


def test_front_camera_students_learn_from_the_teacher_on_the_front_camera_and_are_fine_tuned_from_their_own_run():
    steps = commands_for("ppo:P", FRONT, Path("data/t"), Path("runs/t"), [0, 1], workers=2)
    collects = [s for s in steps if s[1] == "collect"]
    assert collects and all(s[s.index("--env") + 1] == "udacity-style" and s[s.index("--agent") + 1] == "ppo:P" for s in collects)
    sweep = next(s for s in steps if s[1] == "sweep")
    assert sweep[sweep.index("--config") + 1] == "configs/front-camera.json"
    fine_tunes = [s for s in steps if s[1] == "train"]
    assert [(s[s.index("--init-from") + 1], s[s.index("--seed") + 1]) for s in fine_tunes] == [("runs/t/nsac-s0", "0"), ("runs/t/nsac-s1", "1")]
    assert all(s[s.index("--config") + 1] == "configs/front-camera-bnll.json" and "--resume" in s for s in fine_tunes)
    evaluations = [s for s in steps if s[1] == "eval"]
    assert [e[2] for e in evaluations[1:]] == ["runs/t/fine-tune-s0", "runs/t/fine-tune-s1"]
    assert all(e[e.index("--pedal-caution") + 1] == "0.5" for e in evaluations)
    assert not any(s[1] == "dagger" for s in steps)


def test_the_development_stage_drives_other_tracks_into_other_folders():
    protocol, development = (commands_for("expert", DEMO, Path("d"), Path("r"), [0], 2, stage) for stage in ("protocol", "development"))
    assert [s for s in protocol if s[1] != "eval"] == [s for s in development if s[1] != "eval"]  # the same students
    tracks = {stage: {s[s.index("--seeds") + 1] for s in steps if s[1] == "eval"} for stage, steps in
              (("protocol", protocol), ("development", development))}
    assert tracks == {"protocol": {"42,1000-1009"}, "development": {"3000-3010"}}
    outs = [{s[s.index("--out") + 1] for s in steps if s[1] == "eval"} for steps in (protocol, development)]
    assert not outs[0] & outs[1]
