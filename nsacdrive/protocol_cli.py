"""``nsacdrive protocol``: the safety layer judged on shift families and tracks it was not fitted on."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from nsacdrive.common.folder_lock import folder_lock
from nsacdrive.eval.configs import COMMAND_LINE_WORKERS, DriveConfig, MonitorConfig
from nsacdrive.eval.modes import parse_fallback
from nsacdrive.eval.protocol_config import DEVELOPMENT_FAMILIES, TEST_FAMILIES, ProtocolConfig, ProtocolTracks
from nsacdrive.options import config_default, seed_list, split_names
from nsacdrive.outputs import check_output_folder
from nsacdrive.run_loading import WORKER_TASKS_MODULE, load_runs

PROTOCOL_FILE = "protocol.json"


def _known_fallback(spec: str) -> bool:
    try:
        parse_fallback(spec)
    except ValueError:
        return False
    return True


def protocol(
    run: Path = typer.Argument(..., help="A run folder from `nsacdrive train` (calibrated by `nsacdrive calibrate` for the density score)."),
    out: Path = typer.Option(Path("runs/protocol"), "--out", help="Folder for the evaluations (fit/, check/, train-*/, test-*/), protocol.json and protocol.md."),
    train_seeds: str = typer.Option("0-7", "--train-seeds", help="Tracks the controller trained on: the failure predictor and the monitor's selection learn from their logs."),
    fit_seeds: str = typer.Option("1010-1020", "--fit-seeds", help="Held-out tracks whose clean laps set the thresholds."),
    check_seeds: str = typer.Option("1021-1031", "--check-seeds", help="Held-out tracks whose clean laps check the false-alarm rate a second time."),
    test_seeds: str = typer.Option("42,1000-1009", "--test-seeds", help="Held-out tracks that are judged."),
    development: str = typer.Option(",".join(DEVELOPMENT_FAMILIES), "--development", help="Shift families every choice is made on: corruption families and colour presets."),
    test: str = typer.Option(",".join(TEST_FAMILIES), "--test", help="Shift families kept out of every choice (judged once by the fixed split)."),
    severities: str = typer.Option(",".join(map(str, config_default(ProtocolConfig, "severities"))), "--severities", help="Severities each corruption family is driven at."),
    false_alarm_rate: float = typer.Option(config_default(MonitorConfig, "false_alarm_rate"), "--false-alarm-rate", min=0.0001, max=0.5, help="The conformal thresholds' target rate of alarming nominal 1 s windows."),
    confidence: float = typer.Option(config_default(MonitorConfig, "confidence"), "--confidence", min=0.5, max=0.9999, help="The probability with which the target rate holds on new nominal windows."),
    batch: int = typer.Option(11, "--batch", min=1, help="Episodes driven in lockstep per controller call."),
    workers: int = typer.Option(COMMAND_LINE_WORKERS, "--workers", min=1, help="Worker processes."),
    fallbacks: str = typer.Option("stop", "--fallbacks", help="Fallbacks driven on the test tracks under every test family, acting on the monitor selected on the development families: stop, slow, cascade:RUN (a second controller while the alarm lasts), expert (privileged: an upper bound), or none."),
    corruption_module: Optional[list[str]] = typer.Option(None, "--corruption-module", help="A module (dotted name or .py file) whose import registers corruption families, which --development and --test may then name; every worker imports it too. Repeatable."),
    resume: bool = typer.Option(False, "--resume", help="Keep the episodes already driven in --out."),
) -> None:
    """Monitors judged family by family: leave-one-family-out, a fixed development/test split, and the
    conformal false-alarm rate on tracks it was not fitted on."""
    check_output_folder(out)
    modules = tuple(corruption_module or ())
    if modules:  # the user's own families, named on this command line, before the families are checked
        from nsacdrive.envs.corruptions import import_corruption_modules

        import_corruption_modules(modules)
    seeds = {name: tuple(seed_list(text, f"--{name}-seeds", hint=True)) for name, text in
             (("train", train_seeds), ("fit", fit_seeds), ("check", check_seeds), ("test", test_seeds))}
    try:
        config = ProtocolConfig(development=tuple(split_names(development)), test=tuple(split_names(test)),
                                severities=tuple(int(s) for s in split_names(severities)),
                                monitor=MonitorConfig(threshold="conformal", false_alarm_rate=false_alarm_rate, confidence=confidence))
        tracks = ProtocolTracks(**seeds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    guards = [name for name in split_names(fallbacks) if name != "none"]
    if unknown := [name for name in guards if not _known_fallback(name)]:
        raise typer.BadParameter(f"unknown fallbacks {', '.join(unknown)}: expected some of stop, slow, cascade:RUN, expert", param_hint="--fallbacks")
    load_runs([Path(run) for _, run in map(parse_fallback, guards) if run is not None], announce=False)
    load_runs([run])  # a folder that is no run is refused before anything is driven
    if workers > 1:
        from nsacdrive.common.workers import start_worker_server

        start_worker_server(WORKER_TASKS_MODULE)
    from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json, json_safe
    from nsacdrive.common.versions import write_versions
    from nsacdrive.eval.safety_protocol import drive_fallbacks, drive_protocol, judge_fallbacks, judge_protocol, to_terminal

    with folder_lock(out, "nsacdrive protocol"):
        settings = {"batch": batch, "workers": workers, "drive": DriveConfig(corruption_modules=modules)}
        data = drive_protocol(str(run), tracks, config, out, resume=resume, **settings)
        typer.echo(f"judging {sum(map(len, data.test.values()))} test-track and {sum(map(len, data.train.values()))} "
                   f"training-track episodes, {len(config.families)} folds …")
        result = {"run": str(run), "tracks": {name: list(values) for name, values in seeds.items()},
                  **judge_protocol(data, config)}
        if guards:
            typer.echo(f"fallbacks {', '.join(guards)} on the monitor selected on the development families: "
                       f"{result['split']['selected']} …")
            drive_fallbacks(str(run), tracks, config, result["split"], guards, out, resume=resume, **settings)
            result["fallbacks"] = judge_fallbacks(out, config, guards)
        table = to_terminal(result)
        atomic_write_json(out / PROTOCOL_FILE, json_safe(result))
        atomic_write_bytes(out / "protocol.md", (table + "\n").encode())
        write_versions(out)
    typer.echo(table)
    typer.echo(f"every score, window and fold → {out}/{PROTOCOL_FILE}")
