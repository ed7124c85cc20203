"""The ``nsacdrive`` command line: one command, one subcommand per job.

Every subcommand validates its arguments up front and fails with a message that names the
argument and what was expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from nsacdrive.agents.ppo_config import OBS_KINDS
from nsacdrive.common.backends import BACKENDS
from nsacdrive.common.folder_lock import FolderBusy
from nsacdrive.common.shutdown import skip_final_collection
from nsacdrive.common.workers import start_worker_server
from nsacdrive.controllers.model_names import DENSITY_SOURCES, MODEL_NAMES, PRECISION_NAMES
from nsacdrive.data_collection.human import HumanDriveConfig
from nsacdrive.data_collection.recorder import ENVS, LAYOUTS, CollectConfig, NoiseConfig
from nsacdrive.envs.car_racing import FPS, RENDERERS
from nsacdrive.envs.colours import list_presets
from nsacdrive.errors import REFUSALS, Refusal, concerning, reason
from nsacdrive.eval.configs import (
    COMMAND_LINE_INFERENCE,
    COMMAND_LINE_WORKERS,
    DaggerConfig,
    DriveConfig,
    EvalConfig,
    MonitorConfig,
)
from nsacdrive.eval.modes import (
    DEFAULT_MONITOR_SCORE,
    DENSITY_SAMPLES,
    INFERENCE_MODES,
    MONITOR_THRESHOLDS,
    OFFLINE_SPLITS,
    parse_fallback,
)
from nsacdrive.options import choice, config_default, old_spelling, renamed, seed_list, split_names
from nsacdrive.outputs import check_output_file, check_output_folder
from nsacdrive.protocol_cli import protocol
from nsacdrive.run_loading import WORKER_TASKS_MODULE
from nsacdrive.run_loading import load_runs as _load_runs
from nsacdrive.udacity_cli import udacity_app

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame: no ALSA noise on headless machines
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


Model = choice("Model", MODEL_NAMES)
Renderer = choice("Renderer", RENDERERS)
EnvName = choice("EnvName", ENVS)
Layout = choice("Layout", LAYOUTS)
ObsKind = choice("ObsKind", OBS_KINDS)
Backend = choice("Backend", BACKENDS)
Inference = choice("Inference", INFERENCE_MODES)
Split = choice("Split", OFFLINE_SPLITS)
DensitySource = choice("DensitySource", DENSITY_SOURCES)
Precision = choice("Precision", PRECISION_NAMES)
Threshold = choice("Threshold", MONITOR_THRESHOLDS)
PRECISION_HELP = ("The encoders' convolutions in training (overrides the config file): bfloat16 is faster on CPUs with AMX "
                  "tiles and on GPUs, slower elsewhere; the run drives in float32 either way (docs/guide/train.md: Training precision).")
PRESETS = ", ".join(list_presets())  # not a choice: random-N takes any N



class RootCommand(TyperGroup):
    """The ``nsacdrive`` group, speaking in one-line messages around every subcommand: a refusal
    (:data:`nsacdrive.errors.REFUSALS`: bad input, a read-only or full disk, a folder in use, a
    missing extra) ends it with ``error: ...`` and exit code 2 instead of a traceback, and a library
    warning prints as ``warning: ...``; the process then exits without a last collection over its
    imports (:mod:`nsacdrive.common.shutdown`)."""

    def invoke(self, ctx: typer.Context) -> Any:
        skip_final_collection()
        formatwarning = warnings.formatwarning
        warnings.formatwarning = _one_line_warning
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # `nsacdrive ... | head`: click exits quietly
        except REFUSALS as exc:
            typer.secho(f"error: {reason(exc, SETTING_FLAGS)}", fg="red", err=True)
            raise typer.Exit(2) from None
        finally:
            warnings.formatwarning = formatwarning


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    return f"warning: {message}\n"


app = typer.Typer(
    cls=RootCommand,
    help="nsacdrive: uncertainty-aware, interpretable driving control judged in closed loop.",
    no_args_is_help=True,
    add_completion=False,
)
data_app = typer.Typer(help="Inspect demonstration datasets.", no_args_is_help=True)
expert_app = typer.Typer(help="The privileged experts (teachers).", no_args_is_help=True)
env_app = typer.Typer(help="Environment facts: colour presets, corruption families, track geometry.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(expert_app, name="expert")
app.add_typer(env_app, name="env")
app.add_typer(udacity_app, name="udacity")
app.command("protocol")(protocol)


def _presets(text: str) -> list[str]:
    from nsacdrive.envs.colours import validate_preset

    presets = split_names(text)
    if not presets:
        raise typer.BadParameter(f"--colour-preset: no preset named in {text!r}")
    try:
        return [validate_preset(p) for p in presets]
    except ValueError as exc:
        raise typer.BadParameter(f"--colour-preset: {exc}") from None


#: The flag of each config field the library names (it speaks in fields): for resume refusals and
#: the recording's env/layout/renderer check.
SETTING_FLAGS = {
    "runs": "RUN...", "seeds": "--seeds", "colour_presets": "--colour-preset", "repeats": "--repeats", "trials": "--trials",
    "batch": "--batch", "drive.max_steps": "--max-steps", "drive.samples": "--samples", "drive.throttle_cap": "--throttle-cap",
    "drive.pedal_caution": "--pedal-caution", "drive.gas_caution": "--gas-caution",
    "drive.renderer": "--renderer", "drive.raw": "--uncalibrated", "drive.monitor_score": "--monitor-score", "drive.monitor_threshold": "--monitor",
    "drive.monitor_smooth": "--monitor", "drive.monitor_warmup": "--monitor", "drive.fallback": "--fallback",
    "drive.fallback_steps": "--fallback-seconds", "drive.fallback_release": "--fallback-release",
    "drive.corruption_modules": "--corruption-module", "max_steps": "--max-steps", "renderer": "--renderer", "env": "--env", "layout": "--layout",
    "mixing": "DAgger's mixing",  # no collect flag: only `nsacdrive dagger` records episodes with a learner in the loop
}


@contextlib.contextmanager
def _writing(out: Path, command: str) -> Iterator[None]:
    """Hold ``out``'s lock (:mod:`nsacdrive.common.folder_lock`) while ``nsacdrive COMMAND`` writes
    there; another job holding it ends this one with exit 2 and one line naming that job."""
    from nsacdrive.common.folder_lock import folder_lock

    with concerning("--out", (FolderBusy,)), folder_lock(out, f"nsacdrive {command}"):  # only the lock raises FolderBusy
        yield


def _check_device(device: str) -> None:
    """Refuse a ``--device`` this machine cannot use, before any work is done."""
    from nsacdrive.controllers.run import usable_device

    usable_device(device)


@app.command()
def collect(
    out: Path = typer.Option(..., "--out", help="Dataset folder (created; episodes + sidecars + manifest.json)."),
    agent: str = typer.Option("expert", "--agent", help="Agent spec: expert, controller:RUN or ppo:DIR."),
    seeds: str = typer.Option("0-49", "--seeds", help="Track seeds, e.g. '0-49' or '42,1000-1009'."),
    colour_preset: str = typer.Option(",".join(config_default(CollectConfig, "colour_presets")), "--colour-preset", help=f"Comma-separated presets: {PRESETS}."),
    noise: float = typer.Option(config_default(NoiseConfig, "sigma"), "--noise", help="Std of Gaussian noise on the EXECUTED steer and pedal (labels stay clean)."),
    noise_seed: int = typer.Option(config_default(NoiseConfig, "seed"), "--noise-seed", help="Salt of the noise stream (with the track seed)."),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes."),
    max_steps: int = typer.Option(config_default(CollectConfig, "max_steps"), "--max-steps", min=1, help="Episode horizon (1000 = CarRacing standard)."),
    resume: bool = typer.Option(False, "--resume", help="Skip episodes already complete in --out."),
    renderer: Optional[Renderer] = typer.Option(None, "--renderer", help="CarRacing frame renderer: fast (default) or stock (gymnasium's)."),
    env: EnvName = typer.Option(config_default(CollectConfig, "env"), "--env", help="carracing (96×96 top-down) or udacity-style (320×160 front cameras: center, left, right)."),
    layout: Layout = typer.Option(config_default(CollectConfig, "layout"), "--layout", help="episodes (lossless format) or udacity (IMG/*.jpg + driving_log.csv; needs --env udacity-style)."),
    side_offset: float = typer.Option(config_default(CollectConfig, "side_offset"), "--side-offset", help="--env udacity-style: the side cameras' distance to either side (world units; the car is 2.4 wide, the road ~13). With --layout episodes the expert also labels each side camera's frames as if the car stood there."),
    camera_fov: float = typer.Option(config_default(CollectConfig, "camera_fov"), "--camera-fov", help="--env udacity-style: every camera's horizontal field of view (degrees, 10–150). A controller trained on these frames drives with the same camera."),
) -> None:
    """Record demonstrations: one lossless episode file + JSON sidecar per (seed, preset), or the Udacity layout."""
    check_output_folder(out)
    from nsacdrive.data_collection.recorder import collect as run_collect
    from nsacdrive.data_collection.recorder import recording_renderer
    from nsacdrive.eval.agent_kinds import AGENT_KINDS

    recording_renderer(env.value, layout.value, renderer.value if renderer else None, "collect", SETTING_FLAGS)
    config = CollectConfig(agent=agent, seeds=seed_list(seeds), colour_presets=_presets(colour_preset),
                           noise=NoiseConfig(noise, noise_seed), max_steps=max_steps,
                           renderer=renderer.value if renderer else None, env=env.value, layout=layout.value, workers=workers,
                           side_offset=side_offset, camera_fov=camera_fov)
    with _writing(out, "collect"):
        summary = run_collect(config, out, resume=resume, agent_kinds=AGENT_KINDS)
    typer.echo(
        f"wrote {summary.written} episodes ({summary.steps} steps, {summary.steps_per_second:.0f} steps/s), "
        f"skipped {summary.skipped} already complete → {out}"
    )


@data_app.command("info")
def data_info(
    path: Path = typer.Argument(..., help="Dataset folder written by `nsacdrive collect`."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Warn about and skip corrupt episodes instead of failing."),
) -> None:
    """Summarise a dataset: episodes, frames, seeds, sources, colour schemes, action statistics."""
    from nsacdrive.data_collection.summary import summarize

    summary = summarize(path, on_error="skip" if skip_bad else "raise")
    typer.echo(json.dumps(summary.to_dict(), indent=2) if as_json else summary.to_text())


@expert_app.command("evaluate")
def expert_evaluate(
    seeds: str = typer.Option("1000-1099", "--seeds", help="Held-out track seeds."),
    agent: str = typer.Option("expert", "--agent", help="Agent spec."),
    colour_preset: str = typer.Option("default", "--colour-preset", help=f"One colour preset: {PRESETS}."),
    workers: int = typer.Option(2, "--workers", min=1),
    out: Optional[Path] = typer.Option(None, "--out", help="Write per-episode results as JSON here."),
) -> None:
    """Score an agent on held-out tracks (render-free when it needs no pixels)."""
    if out is not None:
        check_output_file(out)
    from nsacdrive.agents.quality import evaluate_agent
    from nsacdrive.common.atomic import atomic_write_json
    from nsacdrive.eval.agent_kinds import AGENT_KINDS

    presets = _presets(colour_preset)
    if len(presets) != 1:
        raise typer.BadParameter("--colour-preset: give exactly one preset")
    report = evaluate_agent(agent, seed_list(seeds), presets[0], workers=workers, agent_kinds=AGENT_KINDS)
    agg = report.aggregate()
    typer.echo(
        f"{agent} on {agg['episodes']} tracks ({presets[0]}): score {agg['score_mean']:.1f} ± {agg['score_std']:.1f} "
        f"(min {agg['score_min']:.1f}), lap finished {100 * agg['lap_finished_rate']:.0f}%, "
        f"score ≥ 900 {100 * agg['score_ge_900_rate']:.0f}%, mean |lateral error| {agg['mean_abs_lateral_error']:.2f}"
    )
    if out is not None:
        atomic_write_json(out, {"agent": agent, "seeds": seeds, "colour_preset": presets[0], **report.to_dict()})
        typer.echo(f"per-episode results → {out}")


@expert_app.command("train")
def expert_train(
    out: Path = typer.Option(..., "--out", help="Model folder: policy.safetensors + policy.json (what driving reads), model.zip + vecnormalize.pkl (pickles, read only by --resume), config.json, tensorboard/, best/."),
    obs: ObsKind = typer.Option("state", "--obs", help="state (privileged vector, render-free physics) or pixels (rl-zoo recipe; hours of CPU)."),
    timesteps: Optional[int] = typer.Option(None, "--timesteps", min=1, help="Decisions to train (env steps of the frame-skipped envs; with --resume: decisions to add). Default: the recipe's (600k state, 4M pixels)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from --out/model.zip and its VecNormalize statistics."),
    seed: int = typer.Option(0, "--seed", help="Seed of the policy and of the training track stream."),
    n_envs: Optional[int] = typer.Option(None, "--n-envs", min=1, help="Parallel envs (default 2 for state, 8 for pixels)."),
    eval_freq: Optional[int] = typer.Option(None, "--eval-freq", min=0, help="Decisions between evaluations on the seed's own evaluation tracks (0 = none); each extends eval/curve.json and eval/curve.png. Default: the recipe's."),
    eval_episodes: Optional[int] = typer.Option(None, "--eval-episodes", min=1, help="Episodes per evaluation. Default: the recipe's."),
    action_change_penalty: Optional[float] = typer.Option(None, "--action-change-penalty", min=0.0, help="state: the charge per unit of L1 change of the policy's action (training envs only). Default: the recipe's."),
    action_change_warmup: Optional[int] = typer.Option(None, "--action-change-warmup", min=0, help="state: decisions over which the action-change penalty ramps from 0 to full (training envs only). Default: the recipe's (0 would charge it in full from the start)."),
    action_noise: Optional[float] = typer.Option(None, "--action-noise", min=0.0, help="state: std of executed-action noise at every physics step of the training envs, as collect --noise adds it. Default: the recipe's (0: none)."),
    state_fields: Optional[str] = typer.Option(None, "--state-fields", help="state: which privileged fields the policy reads: all, or camera (only what a student's frames and speed input show it, so its labels depend on nothing the student cannot see). Default: the recipe's."),
    device: Optional[str] = typer.Option(None, "--device", help="Where the policy's updates run: auto (CUDA when present) | cpu | cuda. Default: the recipe's (cpu for state, auto for pixels)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show SB3's progress bar (needs tqdm and rich)."),
) -> None:
    """Train a Stable-Baselines3 PPO expert (drive it with --agent ppo:DIR)."""
    check_output_folder(out)
    if device is not None:
        _check_device(device)
    from nsacdrive.agents.ppo import train_ppo
    from nsacdrive.agents.ppo_config import PPOConfig

    options = {"timesteps": timesteps, "n_envs": n_envs, "eval_freq": eval_freq, "eval_episodes": eval_episodes,
               "action_change_penalty": action_change_penalty, "action_change_warmup": action_change_warmup,
               "action_noise": action_noise, "state_fields": state_fields, "device": device}
    overrides: dict = {"seed": seed, "progress_bar": progress, **{k: v for k, v in options.items() if v is not None}}
    config = PPOConfig.pixels_recipe(**overrides) if obs.value == "pixels" else PPOConfig.state_recipe(**overrides)
    model = train_ppo(config, out, resume=resume, log=lambda m: typer.echo(m, err=True))
    typer.echo(f"trained {model.num_timesteps} steps → {out} (policy.safetensors + policy.json drive it, "
               f"model.zip + vecnormalize.pkl resume it); evaluate with: nsacdrive expert evaluate --agent ppo:{out}")


@expert_app.command("export")
def expert_export(
    folder: Path = typer.Argument(..., metavar="DIR", help="A PPO folder trained by `nsacdrive expert train` that you made yourself."),
) -> None:
    """Write policy.safetensors + policy.json, all that --agent ppo:DIR reads, from DIR's model.zip and
    vecnormalize.pkl (folders trained before driving read them; run it on DIR/best too). Those two
    files are pickles, which can execute code when loaded: export only folders you made yourself."""
    from nsacdrive.agents.ppo import export_policy

    written = export_policy(folder)
    typer.echo(f"exported → {written} (+ policy.safetensors); drive with --agent ppo:{folder}")


@app.command("drive")
def human_drive(
    record: Optional[Path] = typer.Option(None, "--record", help="Dataset folder for the finished episodes (source 'human'); omit to just play."),
    seed: int = typer.Option(config_default(HumanDriveConfig, "seed"), "--seed", min=0, help="Track seed of the first episode (then seed+1, ...)."),
    colour_preset: str = typer.Option(config_default(HumanDriveConfig, "colour_preset"), "--colour-preset", help=f"Colour preset: {PRESETS}."),
    slow_motion: float = typer.Option(config_default(HumanDriveConfig, "slow_motion"), "--slow-motion", help="Run the game F times slower (F >= 1; 2 = half speed)."),
    max_steps: int = typer.Option(config_default(HumanDriveConfig, "max_steps"), "--max-steps", min=1, help="Episode horizon (1000 = CarRacing standard)."),
    episodes: Optional[int] = typer.Option(None, "--episodes", min=1, help="Stop after this many finished episodes (default: play until Q)."),
    env: EnvName = typer.Option(config_default(HumanDriveConfig, "env"), "--env", help="carracing (CarRacing's top-down window) or udacity-style (the 320×160 front camera, scaled up; records all three cameras)."),
    layout: Optional[Layout] = typer.Option(None, "--layout", help="With --record: episodes (default, lossless format) or udacity (IMG/*.jpg + driving_log.csv; needs --env udacity-style)."),
    window_scale: int = typer.Option(config_default(HumanDriveConfig, "window_scale"), "--window-scale", min=1, help="Front-camera window magnification (3: 960×480)."),
    camera_fov: float = typer.Option(config_default(HumanDriveConfig, "camera_fov"), "--camera-fov", help="--env udacity-style: the cameras' horizontal field of view (degrees, 10–150; as for collect)."),
) -> None:
    """Play CarRacing with the arrow keys (or a gamepad), top-down or from the front camera; R restarts, Q/Esc quits."""
    if record is not None:
        check_output_folder(record, "--record")
    elif layout is not None:
        raise Refusal("--layout: only with --record DIR (without it nothing is written)")
    from nsacdrive.data_collection.human import record_human

    presets = _presets(colour_preset)
    if len(presets) != 1:
        raise ValueError(f"--colour-preset: give one preset, got {colour_preset!r}")
    config = HumanDriveConfig(seed=seed, colour_preset=presets[0], slow_motion=slow_motion, max_steps=max_steps,
                              max_episodes=episodes, env=env.value, layout=layout.value if layout else config_default(HumanDriveConfig, "layout"),
                              window_scale=window_scale, camera_fov=camera_fov)
    session = record_human(record, config)
    where = f" → {record}" if record is not None else ""
    typer.echo(f"wrote {len(session.written)} episodes, {session.restarts} restarts{where}")


@app.command()
def train(
    out: Path = typer.Option(..., "--out", help="Run folder (config.json, model.safetensors, history, TensorBoard logs)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder from `nsacdrive collect` (overrides the config file)."),
    model: Optional[Model] = typer.Option(None, "--model", help="Controller (overrides the config file)."),
    config: Optional[Path] = typer.Option(None, "--config", help="JSON file with TrainConfig fields (docs/guide/train.md); flags override it."),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1),
    max_batches_per_epoch: Optional[int] = typer.Option(None, "--max-batches-per-epoch", min=1, help="Cap on training batches per epoch (a time budget)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seeds initialisation, data order, augmentation, noise."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present) | cpu | cuda."),
    precision: Optional[Precision] = typer.Option(None, "--precision", help=PRECISION_HELP),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="A run folder whose best weights initialise this run (fine-tuning; overrides the config file)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out exactly where it stopped."),
) -> None:
    """Train a controller (encoder + uncertainty head) on recorded demonstrations."""
    check_output_folder(out)
    from nsacdrive.controllers.train_config import TrainConfig
    from nsacdrive.controllers.training import Trainer

    settings = _train_settings(config, data, {"epochs": epochs, "batch_size": batch_size, "max_batches_per_epoch": max_batches_per_epoch,
                                              "seed": seed, "device": device, "precision": precision,
                                              "init_from": str(init_from) if init_from else None}, model)
    _check_device(device)
    train_config = TrainConfig.from_dict(settings)
    trainer = Trainer(train_config, out)
    with _writing(out, "train"):
        state = trainer.fit(resume=resume)
    typer.echo(f"trained {train_config.model.model} for {state.epoch} epochs; best validation loss {state.best_val:.4f} → {out}")


def _train_settings(config: Path | None, data: Path | None, overrides: dict, model: enum.Enum | None) -> dict:
    """TrainConfig fields from a --config file, with the flags given on the command line on top
    (choice flags as their values)."""
    try:
        settings = json.loads(config.read_text()) if config is not None else {}
    except FileNotFoundError:
        raise typer.BadParameter(f"--config: {config} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"--config: {config} is not valid JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise typer.BadParameter(f"--config: {config} must hold a JSON object of training config fields "
                                 f"(configs/demo.json is one), got a {type(settings).__name__}")
    given = {k: v for k, v in {"data": str(data) if data else None, **overrides}.items() if v is not None}
    settings.update({k: v.value if isinstance(v, enum.Enum) else v for k, v in given.items()})
    if model is not None:
        settings["model"] = {**settings.get("model", {}), "model": model.value}
    if "data" not in settings:
        raise typer.BadParameter("--data: give the dataset folder (or 'data' in --config)")
    return settings


@app.command()
def sweep(
    out: Path = typer.Option(..., "--out", help="Folder for one run per model and seed (MODEL-sSEED/) and sweep.json."),
    seeds: str = typer.Option("0-2", "--seeds", help="Training seeds, e.g. 0-2."),
    models: Optional[str] = typer.Option(None, "--models", help=f"Comma-separated controllers ({', '.join(MODEL_NAMES)}); default: the config's."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (overrides the config file)."),
    config: Optional[Path] = typer.Option(None, "--config", help="JSON file with TrainConfig fields; flags override it."),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1),
    max_batches_per_epoch: Optional[int] = typer.Option(None, "--max-batches-per-epoch", min=1),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present on the worker) | cpu | cuda."),
    precision: Optional[Precision] = typer.Option(None, "--precision", help=PRECISION_HELP),
    workers: int = typer.Option(1, "--workers", min=1, help="Trainings at a time (local processes; with --backend ray, a local cluster's CPUs)."),
    backend: Backend = typer.Option("process", "--backend", help="process (local worker processes) or ray (Ray tasks; the optional extra 'ray')."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (host:port, auto, ray://host:port); data and --out on a shared filesystem."),
) -> None:
    """Train every model × seed as one task each, on local processes or a Ray cluster (resumable:
    run it again to finish an interrupted sweep). Every training runs single-threaded, so a seed
    gives the same weights on every backend of one machine."""
    check_output_folder(out)
    from nsacdrive.common.atomic import atomic_write_json
    from nsacdrive.controllers.sweep import seed_sweep, train_sweep
    from nsacdrive.controllers.train_config import TrainConfig

    if address is not None and backend.value != "ray":
        raise typer.BadParameter("--address: only used with --backend ray")
    names = [name.strip() for name in models.split(",") if name.strip()] if models else None
    unknown = sorted(set(names or ()) - set(MODEL_NAMES))
    if unknown:
        raise typer.BadParameter(f"--models: unknown {', '.join(unknown)}; expected some of {', '.join(MODEL_NAMES)}")
    settings = _train_settings(config, data, {"epochs": epochs, "batch_size": batch_size,
                                              "max_batches_per_epoch": max_batches_per_epoch, "device": device,
                                              "precision": precision}, None)
    if address is None:  # a cluster's workers may have devices this machine lacks
        _check_device(device)
    with _writing(out, "sweep"):
        trainings = seed_sweep(TrainConfig.from_dict(settings), seed_list(seeds), names, out)
        typer.echo(f"{len(trainings)} trainings ({', '.join(names or [trainings[0][0].model.model])} × seeds {seeds}) "
                   f"on {backend.value}, {workers} at a time → {out}")
        results = []
        for result in train_sweep(trainings, workers, backend.value, address):
            results.append(dataclasses.asdict(result))
            typer.echo(f"  {result.model} seed {result.seed}: {result.epochs} epochs, best validation loss {result.best_val:.4f} → {result.out}")
        atomic_write_json(out / "sweep.json", {"backend": backend.value, "address": address,
                                               "runs": sorted(results, key=lambda r: (r["model"], r["seed"]))})
    typer.echo(f"summary → {out / 'sweep.json'}")


@app.command()
def calibrate(
    runs: list[Path] = typer.Argument(..., help="Run folders from `nsacdrive train`."),
    data: Path = typer.Option(..., "--data", help="Dataset folder holding the runs' validation track seeds."),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1, help="Fit on an evenly spaced subset of at most this many validation sequences."),
    seed: int = typer.Option(0, "--seed", help="Seeds the prediction draws."),
    density_samples: int = typer.Option(DENSITY_SAMPLES, "--density-samples", min=2, help="Fit the feature density on an evenly spaced subset of at most this many training sequences."),
    isotonic: bool = typer.Option(False, "--isotonic", help="Also fit an isotonic recalibration of the predictive CDF (Kuleshov et al. 2018): it changes intervals and calibration curves, not the mean or variance."),
    density_source: DensitySource = typer.Option("tokens", "--density-source", help="The feature density's features: the encoder's tokens (flags the shifts that reach the head), or tokens+conv, the tokens and every convolution's channel means and root mean squares (flags every input shift, harmless ones included)."),
) -> None:
    """Fit each run's variance scaling and conformal widths on its validation split (RUN/calibration.json) and
    its feature density on its training split (RUN/density.safetensors)."""
    from nsacdrive.eval.calibrate import calibrate_run

    loaded = _load_runs(runs, uncalibrated=True, announce=False)  # the fit replaces calibration.json
    for run in runs:
        with concerning(str(run)):
            summary = calibrate_run(run, data, max_samples, seed, loaded=loaded.pop(run), density_samples=density_samples,
                                    isotonic=isotonic, density_source=density_source.value)
        typer.echo("\n".join(summary.lines()))


@app.command("evaluate-offline")
def evaluate_offline(
    runs: list[Path] = typer.Argument(..., help="Run folders from `nsacdrive train`."),
    data: Path = typer.Option(..., "--data", help="Dataset folder holding the runs' held-out track seeds."),
    split: Split = typer.Option("test", "--split", help="Each run's own held-out seed range."),
    colour_preset: Optional[str] = typer.Option(None, "--colour-preset", help=f"Also evaluate on these seeds recorded under this preset (one of {PRESETS}) and report OOD AUROC."),
    out: Path = typer.Option(Path("runs/offline"), "--out", help="Folder for offline.md / offline.csv / offline.json."),
    train_seeds: int = typer.Option(1, "--train-seeds", min=1, help="Retrain each run with N seeds (seed, seed+1, …) and report mean ± std."),
    workers: int = typer.Option(1, "--workers", min=1, help="Retrainings of --train-seeds at a time (local processes; with --backend ray, a local cluster's CPUs)."),
    backend: Backend = typer.Option("process", "--backend", help="Where the retrainings run: process (local worker processes) or ray (Ray tasks)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster for the retrainings (data and run folders on a shared filesystem)."),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1, help="Evaluate an evenly spaced subset of at most this many sequences per condition."),
    uncalibrated: bool = typer.Option(False, "--uncalibrated", help="Ignore each run's calibration.json (`nsacdrive calibrate`): raw uncertainty."),
    raw: Optional[bool] = old_spelling("--raw"),
    corruptions: Optional[str] = typer.Option(None, "--corruptions", help="Also these held-out corruptions of the clean frames: all, or FAMILY-SEVERITY,... where FAMILY may be all (all-3: every family at severity 3; `nsacdrive env corruptions`)."),
    by_model: bool = typer.Option(False, "--by-model", help="One row per model: mean ± std over its runs (e.g. a sweep's training seeds; they must differ only in the seed)."),
) -> None:
    """One table of uncertainty metrics per action and model, clean, colour-perturbed and corrupted."""
    check_output_folder(out)
    from nsacdrive.envs.corruptions import parse_corruptions
    from nsacdrive.eval.offline import aggregate_seeds, check_seed_repeats, evaluate_run, seed_repeats, table_rows, write_tables

    uncalibrated = renamed("--raw", "--uncalibrated", raw, uncalibrated)
    if colour_preset is not None:
        _presets(colour_preset)
    try:
        specs = parse_corruptions(corruptions) if corruptions is not None else []
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if address is not None and backend.value != "ray":
        raise typer.BadParameter("--address: only used with --backend ray")
    loaded = _load_runs(runs, uncalibrated=True, announce=False)  # evaluate_run applies each calibration.json itself, beside the raw figures
    if by_model:
        check_seed_repeats({run: config for run, (_, config) in loaded.items()})
    results = []
    repeats = seed_repeats(runs, train_seeds, workers, backend.value, address,  # each run first, then its retrainings
                           lambda r: typer.echo(f"retrained {r.model} seed {r.seed}: {r.epochs} epochs → {r.out}"))
    for run in runs:
        for repeat in repeats[run]:
            results.append(evaluate_run(repeat, data, split.value, colour_preset, max_samples, loaded=loaded.pop(repeat, None),
                                        raw=uncalibrated, corruptions=specs, progress=True))
    rows = aggregate_seeds(results) if train_seeds > 1 or by_model else table_rows(results)
    typer.echo(write_tables(results, out, rows))
    for result in results:
        extras = [f"recalibrated by calibration.json ({result['recalibration']}): the _cal columns" if result["recalibration"] != "none" else
                  ("raw only (--uncalibrated)" if uncalibrated else "raw only (no calibration.json: `nsacdrive calibrate`)"),
                  f"density score ({result['density_source']}) from density.safetensors" if result["density"] else "no density score"]
        typer.echo(f"{result['run']}: {'; '.join(extras)}")
    typer.echo(f"\ncalibration: {results[0]['conditions']['clean']['calibration']}")
    typer.echo(f"tables → {out}/offline.md, offline.csv, offline.json")


@app.command()
def monitor(
    evaluations: list[Path] = typer.Argument(..., help="Evaluation folders from `nsacdrive eval` (failures, e.g. under --corruption)."),
    fit: Optional[list[Path]] = typer.Option(None, "--fit", help="Evaluation folder(s) of nominal (clean) laps to set the thresholds on; default: the evaluations' own clean episodes."),
    out: Path = typer.Option(Path("runs/monitor"), "--out", help="Folder for monitor.json, monitor.md and figures/."),
    threshold: Threshold = typer.Option(config_default(MonitorConfig, "threshold"), "--threshold", help="window-rate (recommended): exceeded in --false-alarm-rate of nominal 1 s windows; conformal: the same rate guaranteed on new nominal windows with probability --confidence (a finite-sample corrected order statistic); gamma: the --quantile of a Gamma fitted to the nominal scores."),
    quantile: float = typer.Option(config_default(MonitorConfig, "quantile"), "--quantile", min=0.5, max=0.9999),
    false_alarm_rate: float = typer.Option(config_default(MonitorConfig, "false_alarm_rate"), "--false-alarm-rate", min=0.0001, max=0.5),
    confidence: float = typer.Option(config_default(MonitorConfig, "confidence"), "--confidence", min=0.5, max=0.9999, help="--threshold conformal: the probability that new nominal windows alarm at most at --false-alarm-rate."),
    windows: str = typer.Option(",".join(map(str, config_default(MonitorConfig, "windows_s"))), "--windows", help="Reaction windows in whole seconds."),
    smooth_steps: int = typer.Option(config_default(MonitorConfig, "smooth_steps"), "--smooth", min=1, help="Trailing mean over this many steps (1/50 s each)."),
) -> None:
    """Does each score warn before the car fails? Thresholds on nominal laps; precision, recall, F3 per reaction window."""
    check_output_folder(out)
    from nsacdrive.eval.monitor import run_monitor, to_terminal, write_monitor

    try:
        window_s = tuple(int(w) for w in split_names(windows))
        config = MonitorConfig(windows_s=window_s, smooth_steps=smooth_steps, threshold=threshold.value, quantile=quantile,
                               false_alarm_rate=false_alarm_rate, confidence=confidence)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--windows") from None

    result, episodes = run_monitor(evaluations, fit or [], config)
    write_monitor(result, episodes, out)
    typer.echo(to_terminal(result))
    typer.echo(f"full table (every window: counts, precision, recall, FPR, F3, lead; AUPRC) → {out}/monitor.md, "
               f"monitor.json; figures → {out}/figures/")


def _closed_loop_corruptions(text: str) -> tuple[str, ...]:
    """``--corruption``: ``none`` and suite names as ``parse_corruptions`` reads them (``all``, ``all-3``, ``fog-3``)."""
    from nsacdrive.envs.corruptions import parse_corruptions

    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        names.extend([item] if item == "none" else (spec.name for spec in parse_corruptions(item, "--corruption")))
    return tuple(names)


@app.command("eval")
def closed_loop_eval(
    runs: list[Path] = typer.Argument(..., help="Run folders from `nsacdrive train`."),
    seeds: str = typer.Option("42,1000-1009", "--seeds", help="Held-out track seeds (the same for every model: paired episodes)."),
    colour_preset: str = typer.Option(",".join(config_default(EvalConfig, "colour_presets")), "--colour-preset", help=f"Comma-separated colour presets: {PRESETS}."),
    repeats: int = typer.Option(config_default(EvalConfig, "repeats"), "--repeats", min=1, help="Times the whole evaluation is repeated: success is reported as mean ± std over the repeats."),
    old_repeats: Optional[int] = old_spelling("--runs", min=1),
    trials: int = typer.Option(config_default(EvalConfig, "trials"), "--trials", min=1, help="Episodes per (seed, preset) in each run, each with its own controller RNG seed."),
    renderer: Renderer = typer.Option(config_default(DriveConfig, "renderer"), "--renderer", help="How frames are drawn: fast or stock (gymnasium's code)."),
    max_steps: int = typer.Option(config_default(DriveConfig, "max_steps"), "--max-steps", min=1, help="Episode horizon (1000 = CarRacing standard)."),
    workers: int = typer.Option(COMMAND_LINE_WORKERS, "--workers", min=1),
    batch: int = typer.Option(config_default(EvalConfig, "batch"), "--batch", min=1, help="Episodes driven in lockstep per controller call (one network call per step for all)."),
    inference: Inference = typer.Option(COMMAND_LINE_INFERENCE, "--inference", help="Where the controller runs: inline (in each worker's env loop), process (its own process, double-buffered with a second lockstep group; same episodes), or auto (process when cores >= 2 x workers)."),
    samples: Optional[int] = typer.Option(config_default(DriveConfig, "samples"), "--samples", min=1, help="Draws per prediction (default: the model's own)."),
    throttle_cap: Optional[float] = typer.Option(config_default(DriveConfig, "throttle_cap"), "--throttle-cap", min=0.0, help="Scale gas by min(1, CAP / predictive steering std)."),
    pedal_caution: Optional[float] = typer.Option(config_default(DriveConfig, "pedal_caution"), "--pedal-caution", min=0.0, help="Execute gas − K·σ_gas and brake + K·σ_brake (predictive stds): brake where unsure."),
    gas_caution: Optional[float] = typer.Option(config_default(DriveConfig, "gas_caution"), "--gas-caution", min=0.0, help="With --pedal-caution: the gas's own K (0: caution on the brake alone)."),
    uncalibrated: bool = typer.Option(config_default(DriveConfig, "raw"), "--uncalibrated", help="Ignore each run's calibration.json (`nsacdrive calibrate`): raw uncertainty."),
    raw: Optional[bool] = old_spelling("--raw"),
    device: str = typer.Option(config_default(DriveConfig, "device"), "--device", help="Where the controller runs: cpu, cuda, cuda:N (draws stay on each episode's CPU stream)."),
    corruption_module: Optional[list[str]] = typer.Option(None, "--corruption-module", help="A module (dotted name or .py file) whose import registers corruption families (register_corruption); every worker imports it too. Repeatable."),
    corruption: str = typer.Option(",".join(config_default(EvalConfig, "corruptions")), "--corruption", help="Comma-separated corruptions of the controller's frames: none and/or FAMILY-SEVERITY, where FAMILY may be all (all-3: every family at severity 3; `nsacdrive env corruptions`), or all."),
    monitor_dir: Optional[Path] = typer.Option(None, "--monitor", help="A `nsacdrive monitor` or `nsacdrive protocol` folder: watch --monitor-score every step with its fitted threshold and smoothing (a protocol folder also offers failure_predictor, the learned failure predictor)."),
    monitor_score: str = typer.Option(DEFAULT_MONITOR_SCORE, "--monitor-score", help="The score of --monitor that raises alarms (density needs each run's density.safetensors: `nsacdrive calibrate`)."),
    fallback: str = typer.Option(config_default(DriveConfig, "fallback"), "--fallback", help=f"On an alarm: none (log it), slow (no gas above {config_default(DriveConfig, 'fallback_speed'):g} units/s), stop (brake to a standstill on the road while the controller steers: a safe stop, not a lap; nothing privileged), cascade:RUN (the controller of run folder RUN drives while the alarm lasts, run only then), or expert (the privileged expert drives: an upper bound, an intervention)."),
    fallback_seconds: float = typer.Option(config_default(DriveConfig, "fallback_steps") / FPS, "--fallback-seconds", min=1 / FPS, help="How long the score must stay clear (see --fallback-release) before the fallback hands the car back."),
    fallback_release: float = typer.Option(config_default(DriveConfig, "fallback_release"), "--fallback-release", min=0.01, max=1.0, help="Hysteresis: the score counts as clear only at or below this share of the alarm threshold (1: the threshold itself)."),
    out: Path = typer.Option(Path("runs/closed-loop"), "--out", help="Folder for episodes/, summary.csv, aggregates.json."),
    resume: bool = typer.Option(False, "--resume", help="Skip episodes already evaluated in --out."),
    backend: Backend = typer.Option(config_default(EvalConfig, "backend"), "--backend", help="process (local worker processes) or ray (Ray tasks; the optional extra 'ray')."),
    address: Optional[str] = typer.Option(config_default(EvalConfig, "address"), "--address", help="Ray cluster to join (host:port, auto, ray://host:port); default: a local one of --workers CPUs."),
) -> None:
    """Drive held-out tracks with trained controllers, clean and under colour presets."""
    check_output_folder(out)
    if backend.value == "process" and (workers > 1 or inference.value != "inline"):
        start_worker_server(WORKER_TASKS_MODULE)  # its imports run beside the next line's
    from nsacdrive.eval.closed_loop import evaluate_closed_loop
    from nsacdrive.eval.episode_table import summary_lines
    from nsacdrive.eval.results import condition_label

    if address is not None and backend.value != "ray":
        raise typer.BadParameter("--address: only used with --backend ray")
    if address is None:  # a cluster's workers may have devices this machine lacks
        _check_device(device)
    repeats = renamed("--runs", "--repeats", old_repeats, repeats)
    uncalibrated = renamed("--raw", "--uncalibrated", raw, uncalibrated)
    loaded = _load_runs(runs, uncalibrated=uncalibrated)  # the workers load their own copies (other processes, or one per lockstep group)
    monitoring = _monitor_settings(monitor_dir, monitor_score) if monitor_dir is not None else {}
    if monitor_dir is not None:
        predictor = monitoring.get("monitor_predictor")
        for name in predictor.scores if predictor is not None else (monitor_score,):  # the predictor reads the density too
            _check_monitor_inputs(loaded, name)
    if fallback != "none" and monitor_dir is None:
        raise typer.BadParameter("needs --monitor (a `nsacdrive monitor` folder)", param_hint="--fallback")
    fallback, fallback_run = _fallback_spec(fallback)
    if corruption_module:  # the user's own modules, named on this command line (a saved config never imports them)
        from nsacdrive.envs.corruptions import import_corruption_modules

        import_corruption_modules(corruption_module)
    drive = DriveConfig(max_steps=max_steps, samples=samples, throttle_cap=throttle_cap, pedal_caution=pedal_caution, gas_caution=gas_caution,
                        renderer=renderer.value, raw=uncalibrated,
                        device=device, fallback=fallback, fallback_steps=max(1, round(fallback_seconds * FPS)),
                        fallback_release=fallback_release, fallback_run=fallback_run, corruption_modules=tuple(corruption_module or ()),
                        **monitoring)
    corruptions = _closed_loop_corruptions(corruption)
    config = EvalConfig(runs=tuple(map(str, runs)), seeds=seed_list(seeds), colour_presets=_presets(colour_preset),
                        corruptions=corruptions, repeats=repeats, trials=trials, drive=drive, batch=batch, workers=workers,
                        backend=backend.value, address=address, inference=inference.value)
    with _writing(out, "eval"):
        rows = evaluate_closed_loop(config, out, resume=resume)
    typer.echo("\n".join(summary_lines(rows)))
    if drive.monitor_score is not None:
        typer.echo(f"monitor {drive.monitor_score} > {drive.monitor_threshold:.4g} (smoothed over {drive.monitor_smooth} steps), "
                   f"fallback {drive.fallback}:")
        for r in rows:
            lap = f"{r['mean_lap_steps'] / FPS:.1f} s" if r["mean_lap_steps"] == r["mean_lap_steps"] else "no lap"
            stops = f", {r['safe_stops']} safe stops" if drive.fallback == "stop" else ""
            typer.echo(f"  {r['run']} {condition_label(r)}: {r['alarms_per_episode']:.1f} alarms per episode, "
                       f"{100 * r['fallback_fraction']:.1f} % of steps under the fallback, mean lap {lap}{stops}")
    typer.echo(f"per-step logs and summary → {out}")
    if any(r["faults"] for r in rows):  # the rows counted them; only then read the records for the reason
        _warn_of_faults(out)


def _warn_of_faults(eval_dir: Path) -> None:
    """Say on stderr how many episodes a fault ended (an exception, not the driving) and the first
    reason, which the table counts as ``faults`` and summary.csv lists."""
    from nsacdrive.eval.results import load_records

    faults = [record for record in load_records(eval_dir) if record["failed"]]
    if faults:
        typer.secho(f"warning: {len(faults)} episode(s) could not be driven to the end because of a fault, not the driving "
                    f"(first: {faults[0]['episode_id']}: {faults[0]['reason']}); every reason is in {eval_dir / 'summary.csv'}",
                    fg="yellow", err=True)


#: how a run gets the feature density that the ``density`` monitor score reads
_DENSITY_ADVICE = ", or fit the runs' feature density with `nsacdrive calibrate RUN --data DATA`, then evaluate and monitor again"


def _check_monitor_inputs(loaded: dict[Path, tuple[Any, Any]], score: str) -> None:
    """Refuse the ``density`` score for a run without ``RUN/density.safetensors``: its alarms could
    never fire, and the evaluation would silently run without a monitor."""
    lacking = [str(run) for run, (controller, _) in loaded.items() if getattr(controller, "density", None) is None]
    if score == "density" and lacking:
        raise Refusal(f"--monitor-score density: {', '.join(lacking)}: no feature density (density.safetensors); "
                      "run `nsacdrive calibrate RUN --data DATA`, or pass another --monitor-score")


def _fallback_spec(fallback: str) -> tuple[str, str | None]:
    """``--fallback``: a fallback's name, or ``cascade:RUN`` → (``cascade``, RUN), the run checked now."""
    try:
        name, run = parse_fallback(fallback)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--fallback") from None
    if run is not None:
        _load_runs([Path(run)], announce=False)
    return name, run


def _monitor_settings(monitor_dir: Path, score: str) -> dict[str, Any]:
    """DriveConfig's monitor fields from a ``nsacdrive monitor`` folder (the score's threshold, the
    smoothing, the warm-up) or a ``nsacdrive protocol`` folder (its development-family fit: every
    score's conformal threshold, and the failure predictor's weights)."""
    from nsacdrive.eval.predictor_features import PREDICTOR_SCORE, FailurePredictor
    from nsacdrive.protocol_cli import PROTOCOL_FILE

    protocol = (monitor_dir / PROTOCOL_FILE).exists() and not (monitor_dir / "monitor.json").exists()
    path = monitor_dir / (PROTOCOL_FILE if protocol else "monitor.json")
    try:
        saved = json.loads(path.read_text())
        config = saved["config"]["monitor"] if protocol else saved["config"]
        thresholds = saved["split"]["thresholds"] if protocol else {name: entry["threshold"] for name, entry in saved["scores"].items()}
        if score not in thresholds:
            raise typer.BadParameter(f"{path} has no score {score!r}; it has {', '.join(thresholds)}: pass one as "
                                     f"--monitor-score{_DENSITY_ADVICE if score == 'density' else ''}", param_hint="--monitor-score")
        settings = {"monitor_score": score, "monitor_threshold": float(thresholds[score]),
                    "monitor_smooth": int(config["smooth_steps"]), "monitor_warmup": int(config["warmup_steps"])}
        if score == PREDICTOR_SCORE:
            settings["monitor_predictor"] = FailurePredictor.from_json(saved["split"]["predictor"], f"{path}: split.predictor")
        return settings
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise typer.BadParameter(f"{path}: not a `nsacdrive monitor` or `nsacdrive protocol` result ({exc})", param_hint="--monitor") from None


@app.command("episodes")
def episodes(
    eval_dir: Path = typer.Argument(..., help="Evaluation folder written by `nsacdrive eval --out`."),
    misbehaving: bool = typer.Option(False, "--misbehaving", help="Only the episodes that misbehaved (off the road, spun, stalled, left the playfield) or faulted."),
) -> None:
    """One line per episode of an evaluation: lapped or not, score, seconds, and each misbehaviour event with its start and end."""
    from nsacdrive.eval.episode_table import episode_lines

    typer.echo("\n".join(episode_lines(eval_dir, misbehaving_only=misbehaving)))


@app.command("plot")
def plot(
    eval_dir: Path = typer.Argument(..., help="Evaluation folder written by `nsacdrive eval --out`."),
    out: Optional[Path] = typer.Option(None, "--out", help="Figure folder (default: EVAL_DIR/figures)."),
    episodes: Optional[str] = typer.Option(None, "--episodes", help="Comma-separated episode ids, or 'all' (default: best and worst by score per controller, at most 6)."),
    videos: int = typer.Option(0, "--videos", min=0, help="Also re-drive the first K chosen episodes and write their videos to OUT/videos."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Draws per prediction when re-driving (default: the evaluation's own, from aggregates.json)."),
) -> None:
    """Figures of a closed-loop evaluation: success and scores, then paths, actions and uncertainty per episode."""
    from nsacdrive.eval.plots import write_episode_figures, write_evaluation_figures
    from nsacdrive.eval.results import EvaluationError, choose_episodes, load_aggregates, load_records
    from nsacdrive.eval.video import write_episode_video

    out = out if out is not None else eval_dir / "figures"
    check_output_folder(out)
    load_aggregates(eval_dir)  # validate the folder before writing anything
    records = load_records(eval_dir)
    if episodes is None:
        chosen = choose_episodes(records)
    elif episodes.strip() == "all":
        chosen = [r["episode_id"] for r in records if not r["failed"]]
    else:
        chosen = [e.strip() for e in episodes.split(",") if e.strip()]
        unknown = sorted(set(chosen) - {r["episode_id"] for r in records})
        if unknown:
            raise EvaluationError(f"--episodes: no episode {', '.join(unknown)} in {eval_dir / 'episodes'}")
    for path in write_evaluation_figures(eval_dir, out):
        typer.echo(path)
    for episode_id in chosen:
        for path in write_episode_figures(eval_dir, episode_id, out):
            typer.echo(path)
    for episode_id in chosen[:videos]:
        typer.echo(write_episode_video(eval_dir, episode_id, out / "videos" / f"{episode_id}.mp4", samples=samples))


@app.command()
def report(
    eval_dir: Path = typer.Argument(..., help="Evaluation folder written by `nsacdrive eval --out`."),
    out: Path = typer.Option(..., "--out", help="Report folder: index.html, figures/, data/."),
    run: Optional[str] = typer.Option(None, "--run", help="Run to explain: its name in the evaluation or its folder (default: the evaluation's only run)."),
    offline: Optional[Path] = typer.Option(None, "--offline", help="An `nsacdrive evaluate-offline --out` folder whose table to include."),
    monitor: Optional[Path] = typer.Option(None, "--monitor", help="An `nsacdrive monitor --out` folder whose table and figures to include."),
    episodes: Optional[str] = typer.Option(None, "--episodes", help="Comma-separated episode ids to explain (default: the run's best-scoring track, clean and perturbed)."),
    frames: int = typer.Option(4, "--frames", min=1, help="Grad-CAM frames sampled along the lap."),
    perturbation: Optional[str] = typer.Option(None, "--perturbation", help=f"Colour preset of the perturbed Grad-CAM frames, one of {PRESETS} (default: the evaluation's first non-default preset, else shift-3)."),
) -> None:
    """Static HTML report: closed-loop and offline tables, Grad-CAM with a sanity check, neuron-level potentials."""
    check_output_folder(out)
    from nsacdrive.eval.explain.report import ReportConfig, write_report

    if perturbation is not None:
        named = _presets(perturbation)
        if len(named) != 1:
            raise typer.BadParameter(f"--perturbation: name one preset, got {perturbation!r}")
        perturbation = named[0]
        if perturbation == "default":
            raise typer.BadParameter("--perturbation: choose a preset other than 'default' (the clean frames)")
    chosen = tuple(e.strip() for e in episodes.split(",") if e.strip()) if episodes is not None else None
    config = ReportConfig(run=run, offline=offline, monitor=monitor, episodes=chosen or None, frames=frames, perturbation=perturbation)
    index = write_report(eval_dir, out, config)
    typer.echo(f"report → {index}")


@app.command()
def dagger(
    init: Path = typer.Option(..., "--init", help="Behaviour-cloned run folder every round starts from (round 0)."),
    out: Path = typer.Option(..., "--out", help="DAgger folder: dagger.json, data/round-k, runs/round-k, report.json."),
    expert: str = typer.Option(config_default(DaggerConfig, "expert"), "--expert", help="Agent spec that labels the learner's states: the teacher of the init run's data (expert, expert:smooth, expert:gentle, ppo:DIR)."),
    rounds: int = typer.Option(config_default(DaggerConfig, "rounds"), "--rounds", min=1),
    episodes_per_round: int = typer.Option(config_default(DaggerConfig, "episodes_per_round"), "--episodes-per-round", min=1, help="Training tracks driven per round (per colour preset)."),
    beta0: float = typer.Option(config_default(DaggerConfig, "beta0"), "--beta0", min=0.0, max=1.0, help="β of round 1: probability that the expert drives a step."),
    beta_decay: float = typer.Option(config_default(DaggerConfig, "beta_decay"), "--beta-decay", min=0.0, max=1.0, help="β_k = beta0 · decay^(k−1)."),
    seeds: Optional[str] = typer.Option(config_default(DaggerConfig, "seeds"), "--seeds", help="Tracks to drive in the rounds (default: the init run's training seeds)."),
    colour_preset: str = typer.Option(",".join(config_default(DaggerConfig, "colour_presets")), "--colour-preset", help=f"Comma-separated colour presets driven in the rounds: {PRESETS}."),
    epochs_per_round: int = typer.Option(config_default(DaggerConfig, "epochs_per_round"), "--epochs-per-round", min=1),
    lr: Optional[float] = typer.Option(config_default(DaggerConfig, "lr"), "--lr", help="Fine-tuning learning rate of every round (default: the init run's)."),
    max_steps: int = typer.Option(config_default(DaggerConfig, "max_steps"), "--max-steps", min=1, help="Horizon of the round episodes (and, by default, of the evaluation's)."),
    max_batches_per_epoch: Optional[int] = typer.Option(config_default(DaggerConfig, "max_batches_per_epoch"), "--max-batches-per-epoch", min=1, help="Default: the init run's."),
    eval_seeds: Optional[str] = typer.Option(config_default(DaggerConfig, "eval_seeds"), "--eval-seeds", help="Held-out tracks for the BC-vs-DAgger closed-loop table."),
    eval_colour_preset: str = typer.Option(",".join(config_default(DaggerConfig, "eval_colour_presets")), "--eval-colour-preset", help="Comma-separated presets of that table, e.g. default,shift-3."),
    eval_max_steps: Optional[int] = typer.Option(None, "--eval-max-steps", min=1, help="Horizon of that table's episodes (default: --max-steps)."),
    workers: int = typer.Option(config_default(DaggerConfig, "workers"), "--workers", min=1),
    seed: int = typer.Option(config_default(DaggerConfig, "seed"), "--seed", help="Seeds track choice, mixing, training."),
) -> None:
    """DAgger: the learner drives, the privileged expert labels, the controller is fine-tuned; resumable."""
    check_output_folder(out)
    if workers > 1:
        start_worker_server(WORKER_TASKS_MODULE)  # the rounds' drives and the evaluation fork their workers from it
    from nsacdrive.eval.dagger import Dagger, format_report

    config = DaggerConfig(init=str(init), expert=expert, rounds=rounds, episodes_per_round=episodes_per_round, beta0=beta0,
                          beta_decay=beta_decay, seeds=seeds, colour_presets=tuple(_presets(colour_preset)),
                          epochs_per_round=epochs_per_round, lr=lr, max_steps=max_steps,
                          max_batches_per_epoch=max_batches_per_epoch, workers=workers, seed=seed, eval_seeds=eval_seeds,
                          eval_colour_presets=tuple(_presets(eval_colour_preset)),
                          eval_max_steps=eval_max_steps if eval_max_steps is not None else max_steps)
    with _writing(out, "dagger"):
        report = Dagger(config, out).run()
    if "closed_loop" in report:
        typer.echo(format_report(report))
    typer.echo(f"DAgger rounds → {out}/runs, report → {out}/report.json")


@env_app.command("presets")
def env_presets(seed: int = typer.Option(42, "--seed", help="Track seed used to resolve seeded presets.")) -> None:
    """List the colour presets and the colours they give on one track seed."""
    from nsacdrive.envs.colours import list_presets, resolve_colour_scheme

    typer.echo(f"{'preset':<10}{'road':>22}{'background':>22}{'grass':>22}")
    for name in list_presets():
        resolved = name.replace("random-N", "random-7")
        s = resolve_colour_scheme(resolved, seed)
        fmt = lambda c: "(" + ",".join(f"{v:.0f}" for v in c) + ")"  # noqa: E731
        typer.echo(f"{resolved:<10}{fmt(s.road):>22}{fmt(s.background):>22}{fmt(s.grass):>22}")


@env_app.command("corruptions")
def env_corruptions() -> None:
    """List the held-out corruption families (one per line, name first; use as FAMILY-SEVERITY, severity 1-5)."""
    from nsacdrive.envs.corruptions import describe_families

    typer.echo("\n".join(describe_families()))


if __name__ == "__main__":
    app()
