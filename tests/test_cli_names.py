"""The command line's names and defaults: renamed flags keep their old spelling for a release,
the recommended monitor settings are the defaults, eval's, monitor's and dagger's defaults are
their config classes', and terminal tables fit 100 columns."""

from __future__ import annotations

import pytest
import typer
from data_fixtures import normalize
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.eval.episode_table import LINE_WIDTH as TABLE_WIDTH
from nsacdrive.eval.episode_table import summary_lines as _summary_table


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def options_of(command: str) -> dict[str, object]:
    """Option name → click parameter of ``nsacdrive COMMAND`` (hidden ones included)."""
    group = typer.main.get_command(app)
    found = group.get_command(group.context_class(group), command)
    return {opt: param for param in found.params for opt in getattr(param, "opts", [])}


@pytest.mark.parametrize(("command", "old", "new"), [("eval", "--runs", "--repeats"), ("eval", "--raw", "--uncalibrated"),
                                                     ("evaluate-offline", "--raw", "--uncalibrated")])
def test_a_renamed_flag_keeps_its_old_spelling_hidden(command, old, new):
    options = options_of(command)
    assert not options[new].hidden and options[old].hidden
    help_text = normalize(invoke(command, "--help").output)
    assert new in help_text and old not in help_text.replace(new, "")


def test_the_old_spelling_still_works_and_says_it_is_deprecated(tmp_path):
    result = invoke("eval", tmp_path / "no-run", "--seeds", "1000", "--runs", "2", "--out", tmp_path / "eval")
    assert "warning: --runs is deprecated, use --repeats" in normalize(result.output)


def test_the_recommended_monitor_settings_are_the_defaults():
    from nsacdrive.eval.monitor import MonitorConfig

    assert MonitorConfig().threshold == "window-rate"
    assert options_of("monitor")["--threshold"].default == "window-rate"
    assert options_of("eval")["--monitor-score"].default == "density"


def test_the_defaults_of_eval_monitor_and_dagger_are_their_configs():
    from nsacdrive.envs.car_racing import FPS
    from nsacdrive.eval.configs import (
        COMMAND_LINE_INFERENCE,
        COMMAND_LINE_WORKERS,
        DaggerConfig,
        DriveConfig,
        EvalConfig,
        MonitorConfig,
    )

    drive, evaluation = DriveConfig(), EvalConfig(runs=("run",), seeds=(1,))
    monitor, dagger = MonitorConfig(), DaggerConfig(init="run")
    expected = {("eval", "--max-steps"): drive.max_steps, ("eval", "--renderer"): drive.renderer, ("eval", "--device"): drive.device,
                ("eval", "--fallback"): drive.fallback, ("eval", "--batch"): evaluation.batch, ("eval", "--trials"): evaluation.trials,
                ("eval", "--corruption"): ",".join(evaluation.corruptions), ("monitor", "--quantile"): monitor.quantile,
                ("monitor", "--false-alarm-rate"): monitor.false_alarm_rate, ("monitor", "--windows"): ",".join(map(str, monitor.windows_s)),
                ("monitor", "--smooth"): monitor.smooth_steps, ("dagger", "--rounds"): dagger.rounds, ("dagger", "--beta0"): dagger.beta0,
                ("dagger", "--beta-decay"): dagger.beta_decay, ("dagger", "--epochs-per-round"): dagger.epochs_per_round,
                ("dagger", "--max-steps"): dagger.max_steps,
                # the command's own defaults (a worker per core, the controller placed by core count), named beside EvalConfig
                ("eval", "--workers"): COMMAND_LINE_WORKERS, ("eval", "--inference"): COMMAND_LINE_INFERENCE}
    assert {key: options_of(key[0])[key[1]].default for key in expected} == expected
    assert round(options_of("eval")["--fallback-seconds"].default * FPS) == drive.fallback_steps  # the CLI's seconds → steps
    assert (evaluation.workers, evaluation.inference) == (1, "inline")  # a library call starts no process


def test_evals_terminal_table_fits_100_columns_and_shows_laps_beside_off_road_events():
    row = {"run": "runs/" + "a-very-long-run-name-" * 6, "model": "ensemble", "colour_preset": "shift-3",
           "corruption": "camera-tilt-4", "episodes": 110, "faults": 0, "laps": 97, "off_road_events": 23,
           "success_mean": 0.88, "success_std": 0.04, "score_mean": 901.3, "mean_abs_lateral_error": 1.42, "driving_score": 0.93}
    lines = _summary_table([row, {**row, "run": "runs/nsac", "corruption": "none"}])
    assert max(len(line) for line in lines) <= TABLE_WIDTH
    header = lines[0].split()
    assert header.index("laps") + 1 == header.index("off-road")
    assert "…" in lines[1] and lines[2].startswith("runs/nsac (")
