"""The teacher-students study: its steps follow make demo with the teacher everywhere, and its table."""

from __future__ import annotations

from pathlib import Path

from bench.teacher_students import commands_for, laps_by_run, laps_cell, student_runs, teacher_name


def test_teacher_names_make_folder_names():
    assert teacher_name("expert") == "expert"
    assert teacher_name("ppo:runs/ppo/state-s0/best") == "ppo-runs-ppo-state-s0-best"


def test_the_teacher_records_the_demonstrations_and_labels_the_dagger_round():
    steps = commands_for("ppo:P", Path("data/t"), Path("runs/t"), [0, 1], workers=2)
    collects = [s for s in steps if s[1] == "collect"]
    assert len(collects) == 3 and all(s[s.index("--agent") + 1] == "ppo:P" for s in collects)
    daggers = [s for s in steps if s[1] == "dagger"]
    assert [s[s.index("--init") + 1] for s in daggers] == ["runs/t/nsac-s0", "runs/t/nsac-s1"]
    assert all(s[s.index("--expert") + 1] == "ppo:P" for s in daggers)
    evaluation = steps[-1]
    assert evaluation[1] == "eval" and "runs/t/dagger-s1/runs/round-1" in evaluation


def test_laps_are_counted_per_run_path_not_per_run_name():
    runs = student_runs(Path("runs/t"), [0, 1])["dagger"]
    records = [{"run": str(run), "colour_preset": "default", "lap_finished": finished, "failed": False}
               for run, finished in ((runs[0], True), (runs[0], True), (runs[1], False), (runs[1], True))]
    records.append({"run": str(runs[1]), "colour_preset": "default", "lap_finished": True, "failed": True})  # a fault is no lap
    laps = laps_by_run(records)
    assert laps[(str(runs[1]), "default")] == (1, 3)
    assert laps_cell(runs, "default", laps) == "2 / 1"  # 2 and 3 episodes: no common "of N"
    assert laps_cell(runs, "shift-3", laps) == "– / –"
    records.append({"run": str(runs[0]), "colour_preset": "default", "lap_finished": False, "failed": False})
    assert laps_cell(runs, "default", laps_by_run(records)) == "2 / 1 of 3"
