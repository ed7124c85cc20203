"""``nsacdrive udacity ...``: the Udacity-simulator-style pipeline (import recordings, serve the simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nsacdrive.data_collection.udacity_import import ImportConfig
from nsacdrive.errors import concerning
from nsacdrive.eval.modes import THROTTLE_MODES
from nsacdrive.options import choice, config_default, old_spelling, renamed
from nsacdrive.outputs import check_output_file, check_output_folder

Throttle = choice("Throttle", THROTTLE_MODES)
udacity_app = typer.Typer(help="Udacity-simulator-style data and driving: import recordings, serve the simulator.",
                          no_args_is_help=True)


@udacity_app.command("import")
def import_recording(
    recording: Path = typer.Argument(..., help="Recording folder: driving_log.csv (header optional) + IMG/."),
    out: Path = typer.Option(..., "--out", help="Dataset folder (created; episodes + sidecars + manifest.json)."),
    skip_missing: bool = typer.Option(False, "--skip-missing", help="Leave out rows whose images are missing or unreadable instead of failing."),
    seed: int = typer.Option(config_default(ImportConfig, "first_seed"), "--seed", min=0, help="Track seed of the first episode (episodes get seed, seed+1, …); "
                             "give disjoint ranges to import several recordings into one folder."),
    episode_length: int = typer.Option(config_default(ImportConfig, "episode_length"), "--episode-length", min=1, help="Steps per episode (the last of a stretch takes the rest)."),
    allow_outside: bool = typer.Option(False, "--allow-outside", help="Read image paths that lead outside the recording "
                                       "folder (after .. and symlinks); refused by default."),
) -> None:
    """Import a Udacity simulator recording as episodes (source udacity-import) for `nsacdrive train`."""
    check_output_folder(out)
    from nsacdrive.data_collection.udacity_import import import_recording as run_import

    result = run_import(recording, out, ImportConfig(episode_length, seed, skip_missing, allow_outside), progress=True)
    for line in result.problems.lines():
        typer.secho(f"skipped {line}", fg="yellow", err=True)
    typer.echo(f"imported {result.episodes} episodes ({result.steps} steps; track seeds {seed}-{seed + result.episodes - 1}; "
               f"cameras {','.join(result.cameras)}) from {result.rows} log rows ({'with' if result.header else 'no'} header, "
               f"{result.skipped_rows} skipped) → {result.out}")


@udacity_app.command("serve")
def serve(
    run: Path = typer.Argument(..., help="Run folder from `nsacdrive train` (any controller)."),
    port: int = typer.Option(4567, "--port", min=1, max=65535, help="TCP port (the simulator connects to 4567)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; 0.0.0.0 for a simulator on another machine."),
    throttle: Throttle = typer.Option("law", "--throttle", help="law: 1 − steer² − (speed/limit)² | model: the controller's gas − brake."),
    speed_limit: float = typer.Option(25.0, "--speed-limit", help="Throttle law: the speed limit (simulator mph)."),
    slow_limit: float = typer.Option(10.0, "--slow-limit", help="Throttle law: the limit while over --speed-limit."),
    pedal_caution: Optional[float] = typer.Option(None, "--pedal-caution", min=0.0, help="--throttle model: gas − K·σ_gas and brake + K·σ_brake (brake where unsure)."),
    gas_caution: Optional[float] = typer.Option(None, "--gas-caution", min=0.0, help="With --pedal-caution: the gas's own K (0: caution on the brake alone)."),
    log: Optional[Path] = typer.Option(None, "--log", help="Per-frame log of predictions and uncertainty: FILE.csv → CSV, else JSON Lines "
                                       "(a new file; see --overwrite-log)."),
    overwrite_log: bool = typer.Option(False, "--overwrite-log", help="Replace the --log file if it exists (refused by default)."),
    cors_origin: Optional[List[str]] = typer.Option(None, "--cors-origin", help="A browser origin allowed to connect, e.g. "
                                                    "http://localhost:8080 (repeat or comma-separate; default: none — the simulator sends no origin)."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Draws per prediction (default: the model's own)."),
    uncalibrated: bool = typer.Option(False, "--uncalibrated", help="Ignore the run's calibration.json (`nsacdrive calibrate`): raw uncertainty."),
    raw: Optional[bool] = old_spelling("--raw"),
) -> None:
    """Drive the Udacity simulator: a Socket.IO server (the simulator's protocol) answering telemetry with a controller."""
    import logging

    from nsacdrive.eval.serve.udacity_server import (
        FrameLog,
        ServeConfig,
        TelemetryHandler,
        existing_log_error,
        parse_origins,
        serve,
    )

    if log is not None:
        check_output_file(log, "--log")
        if log.exists() and not overwrite_log:
            raise existing_log_error(log)  # before the run loads; FrameLog refuses it again atomically

    events = logging.StreamHandler()  # this server's events only (python-socketio stays at its quiet default)
    events.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("nsacdrive.eval.serve.udacity_server").addHandler(events)
    logging.getLogger("nsacdrive.eval.serve.udacity_server").setLevel(logging.INFO)
    origins = parse_origins(cors_origin or [])
    handler = TelemetryHandler.from_run(run, ServeConfig(throttle.value, speed_limit, slow_limit, pedal_caution, gas_caution), samples,
                                      renamed("--raw", "--uncalibrated", raw, uncalibrated))
    frame_log = FrameLog(log, overwrite_log) if log is not None else None

    def ready() -> None:
        calibration = handler.agent.model.calibration
        recalibrated = f"recalibrated by {run}/calibration.json ({calibration.method})" if calibration is not None else "raw uncertainty"
        typer.echo(f"serving {run} on {host}:{port} (throttle {throttle.value}, log {log or 'off'}, {recalibrated}); Ctrl-C stops")

    try:
        with concerning(f"server on {host}:{port}", (OSError,)):
            serve(handler, host, port, frame_log, ready, origins)
    finally:
        if frame_log is not None:
            frame_log.close()
