"""Loading the run folders a command drives, and what its worker processes import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from nsacdrive.errors import concerning

#: what the workers of `eval` and `dagger` run: it imports the closed-loop evaluation's and the recorder's
#: tasks (torch, the envs, the controllers); their fork server imports it before the command's own
#: imports are done (nsacdrive.common.workers)
WORKER_TASKS_MODULE = "nsacdrive.eval.dagger"


def load_runs(runs: list[Path], uncalibrated: bool = False, announce: bool = True) -> dict[Path, tuple[Any, Any]]:
    """Load every run (config and weights, checked against the architecture) before any driving or
    computing: a mistyped, incomplete or corrupt run folder is an error now, not a failed row in a
    summary later. Says which runs' predictions are recalibrated (``RUN/calibration.json``; never
    when ``uncalibrated``) unless not ``announce`` (callers that load raw and apply it themselves). Returns
    run → (controller, training config), for work done in this process."""
    from nsacdrive.controllers.calibration import CALIBRATION_FILE
    from nsacdrive.controllers.run import load_run

    loaded = {}
    for run in runs:
        with concerning(f"cannot load run {run}"):
            loaded[run] = load_run(run, raw=uncalibrated)
        calibration = loaded[run][0].calibration
        if not announce:
            continue
        if calibration is not None:
            typer.echo(f"{run}: applying {CALIBRATION_FILE} ({calibration.method}, fitted on validation tracks "
                       f"{','.join(map(str, calibration.val_seeds))}; --uncalibrated ignores it)")
        elif uncalibrated and (run / CALIBRATION_FILE).exists():
            typer.echo(f"{run}: --uncalibrated: {CALIBRATION_FILE} ignored")
    return loaded
