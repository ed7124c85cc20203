"""The ``nsacdrive`` command line (nsacdrive/cli.py) through typer's CliRunner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import normalize, write_synthetic
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.summary import ACTION_NAMES
from nsacdrive.envs.colours import list_presets

EPISODE = "expert_default_seed000000"
STEPS = 40


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def cli_dataset(tmp_path_factory):
    """`nsacdrive collect --seeds 0 --max-steps 40 --workers 1 --out DIR` → (result, DIR). Read-only."""
    out = tmp_path_factory.mktemp("cli") / "data"
    result = invoke("collect", "--seeds", "0", "--max-steps", STEPS, "--workers", "1", "--out", out)
    return result, out


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    return dest


# --------------------------------------------------------------------------- collect


def test_collect(cli_dataset):
    result, out = cli_dataset
    assert result.exit_code == 0, result.output
    assert f"wrote 1 episodes ({STEPS} steps," in result.output
    assert "skipped 0 already complete" in result.output
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{EPISODE}.json", f"{EPISODE}.npz", "manifest.json", ".settings.json"])
    sidecar, arrays = load_episode_arrays(out / f"{EPISODE}.json")
    assert sidecar["n_steps"] == STEPS and sidecar["track_seed"] == 0 and sidecar["colour_preset"] == "default"
    assert sidecar["noise"] == {"sigma": 0.0, "seed": 0}
    assert arrays["observations"].shape == (STEPS + 1, 96, 96, 3)


def test_collect_again_needs_resume(cli_dataset, tmp_path):
    out = _copy(cli_dataset[1], tmp_path / "data")
    before = (out / f"{EPISODE}.npz").stat().st_mtime_ns
    result = invoke("collect", "--seeds", "0", "--max-steps", STEPS, "--workers", "1", "--out", out)
    assert result.exit_code == 2
    text = normalize(result.output)
    assert text.startswith("error: ") and "--resume" in text and EPISODE in text
    result = invoke("collect", "--seeds", "0", "--max-steps", STEPS, "--workers", "1", "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    assert "wrote 0 episodes (0 steps" in result.output and "skipped 1 already complete" in result.output
    assert (out / f"{EPISODE}.npz").stat().st_mtime_ns == before


@pytest.mark.parametrize("seeds", ["3-1", "abc", "1,1", "", "0-2,x"])
def test_collect_bad_seeds(tmp_path, seeds):
    result = invoke("collect", "--seeds", seeds, "--out", tmp_path / "out", "--workers", "1")
    assert result.exit_code == 2
    assert "--seeds" in normalize(result.output)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset", ["neon", "default,shift-9", "random-x"])
def test_collect_bad_colour_preset(tmp_path, preset):
    result = invoke("collect", "--seeds", "0", "--colour-preset", preset, "--out", tmp_path / "out")
    assert result.exit_code == 2
    text = normalize(result.output)
    assert "--colour-preset" in text and "unknown colour preset" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--noise", "-0.5"], "--noise must be a number in [0, 2.0] (the std of the noise on actions in [-1, 1]), got -0.5"),
        (["--noise", "inf"], "--noise must be a number in [0, 2.0] (the std of the noise on actions in [-1, 1]), got inf"),
        (["--noise", "nan"], "--noise must be a number in [0, 2.0] (the std of the noise on actions in [-1, 1]), got nan"),
        (["--noise-seed", "-1"], "--noise-seed must be an integer in [0, 2**63), got -1"),
        (["--seeds", "0-999999999999"], "--seeds: seed 999999999999 in '0-999999999999' is above the largest seed, 4294967295"),
        (["--agent", "pilot"], "--agent: unknown agent 'pilot'"),
        (["--workers", "0"], "--workers"),
        (["--max-steps", "0"], "--max-steps"),
        (["--seeds", "0", "--noise", "lots"], "--noise"),
    ],
)
def test_collect_other_bad_arguments(tmp_path, args, fragment):
    result = invoke("collect", "--seeds", "0", "--out", tmp_path / "out", *args)
    assert result.exit_code == 2
    assert fragment in normalize(result.output)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layout", "udacity"], "error: --layout udacity needs --env udacity-style (the Udacity layout holds 320×160 camera frames)"),
        (["--env", "udacity-style", "--renderer", "stock"],
         "error: --renderer: the udacity-style env draws its own front camera; --renderer stock is for --env carracing"),
    ],
)
def test_collect_refuses_settings_that_do_not_go_together_in_one_line_naming_the_flags(tmp_path, args, message):
    result = invoke("collect", "--seeds", "0", "--out", tmp_path / "out", *args)
    assert result.exit_code == 2
    assert normalize(result.output) == message  # the recorder's own check, its fields named as flags
    assert not (tmp_path / "out").exists()


def test_collect_requires_out():
    result = invoke("collect", "--seeds", "0")
    assert result.exit_code == 2
    assert "--out" in normalize(result.output)


# --------------------------------------------------------------------------- data info


def test_data_info_text(cli_dataset):
    _, out = cli_dataset
    result = invoke("data", "info", out)
    assert result.exit_code == 0, result.output
    _, arrays = load_episode_arrays(out / f"{EPISODE}.json")
    text = result.output
    assert f"dataset            {out}\n" in text
    assert "episodes           1\n" in text
    assert f"frames (steps)     {STEPS}\n" in text
    assert "track seeds        0  (1 tracks)\n" in text
    assert "sources            expert (1)\n" in text
    assert "agents             expert (1)\n" in text
    assert "colour presets     default (1)\n" in text
    assert "lap finished       0.0%\n" in text
    assert "terminations       time_limit (1)\n" in text
    assert "camera FOV" not in text  # top-down frames have no front camera
    reward = float(np.sum(arrays["rewards"], dtype=np.float64))
    assert f"episode reward     {reward:.1f} ± 0.0\n" in text
    steer = arrays["actions"][:, 0]
    assert f"executed  steer    {steer.mean():8.3f}{steer.std():8.3f}{steer.min():8.3f}{steer.max():8.3f}" in text


def test_data_info_json(cli_dataset):
    _, out = cli_dataset
    result = invoke("data", "info", out, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    _, arrays = load_episode_arrays(out / f"{EPISODE}.json")
    assert info["root"] == str(out)
    assert info["episodes"] == 1
    assert info["frames"] == STEPS
    assert info["seeds"] == "0"
    assert info["sources"] == {"expert": 1}
    assert info["colour_presets"] == {"default": 1}
    assert info["agents"] == {"expert": 1}
    assert info["termination_reasons"] == {"time_limit": 1}
    assert info["lap_finished_rate"] == 0.0
    assert info["reward_mean"] == pytest.approx(float(np.sum(arrays["rewards"], dtype=np.float64)), abs=1e-6)
    assert info["reward_std"] == 0.0
    for kind, key in (("executed", "actions"), ("label", "expert_actions")):
        values = arrays[key].astype(np.float64)
        for i, name in enumerate(ACTION_NAMES):
            stats = info["action_stats"][kind][name]
            assert stats["mean"] == pytest.approx(values[:, i].mean(), rel=1e-5, abs=1e-7)
            assert stats["std"] == pytest.approx(values[:, i].std(), rel=1e-5, abs=1e-7)
            assert stats["min"] == values[:, i].min() and stats["max"] == values[:, i].max()


def test_data_info_missing_folder(tmp_path):
    result = invoke("data", "info", tmp_path / "nowhere")
    assert result.exit_code == 2
    text = normalize(result.output)
    assert text.startswith("error: ") and "nowhere: dataset folder does not exist" in text


def test_data_info_empty_folder(tmp_path):
    result = invoke("data", "info", tmp_path)
    assert result.exit_code == 2
    text = normalize(result.output)
    assert "no episodes found" in text and str(tmp_path) in text


def test_data_info_corrupt_episode(cli_dataset, tmp_path):
    out = _copy(cli_dataset[1], tmp_path / "data")
    write_synthetic(out, "zz_broken", 10, track_seed=99, textured=False)
    data = out / "zz_broken.npz"
    data.write_bytes(data.read_bytes()[:-10])
    result = invoke("data", "info", out)
    assert result.exit_code == 2
    assert "zz_broken.npz" in normalize(result.output) and "truncated" in normalize(result.output)
    with pytest.warns(UserWarning, match="zz_broken"):
        result = invoke("data", "info", out, "--skip-bad", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["episodes"] == 1 and info["frames"] == STEPS and info["seeds"] == "0"


def test_data_info_counts_several_episodes(tmp_path):
    for i, (seed, n) in enumerate([(4, 10), (5, 12), (6, 7), (9, 3)]):
        write_synthetic(tmp_path, f"ep{i}", n, track_seed=seed, textured=False,
                        colour_preset="shift-2" if i % 2 else "default")
    info = json.loads(invoke("data", "info", tmp_path, "--json").output)
    assert (info["episodes"], info["frames"], info["seeds"]) == (4, 32, "4-6,9")
    assert info["colour_presets"] == {"default": 2, "shift-2": 2}


def test_data_info_warns_in_one_line_about_episode_files_without_a_sidecar(cli_dataset, tmp_path):
    out = _copy(cli_dataset[1], tmp_path / "data")
    write_synthetic(out, "lost", 10, track_seed=99, textured=False)
    (out / "lost.json").unlink()
    result = subprocess.run([sys.executable, "-m", "nsacdrive.cli", "data", "info", out, "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"warning: {out}: ignoring 1 episode file(s) without a JSON sidecar: lost.npz\n"
    assert json.loads(result.stdout)["episodes"] == 1


# --------------------------------------------------------------------------- expert evaluate (argument errors only)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--seeds", "9-1"], ["--seeds", "runs backwards"]),
        (["--colour-preset", "default,shift-1"], ["--colour-preset", "give exactly one preset"]),
        (["--colour-preset", "neon"], ["--colour-preset", "unknown colour preset"]),
        (["--agent", "pilot"], ["--agent: unknown agent 'pilot'"]),
        (["--workers", "0"], ["--workers"]),
    ],
)
def test_expert_evaluate_bad_arguments(tmp_path, args, fragments):
    result = invoke("expert", "evaluate", "--out", tmp_path / "r.json", *args)
    assert result.exit_code == 2
    text = normalize(result.output)
    for fragment in fragments:
        assert fragment in text
    assert not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- env presets


def test_env_presets_lists_every_preset():
    result = invoke("env", "presets")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["preset", "road", "background", "grass"]
    names = [line.split()[0] for line in lines[1:]]
    assert names == [p.replace("random-N", "random-7") for p in list_presets()]
    assert lines[1].split() == ["default", "(102,102,102)", "(102,204,102)", "(102,230,102)"]


def test_env_presets_seed_changes_only_seeded_presets():
    a = invoke("env", "presets", "--seed", "1").output.splitlines()
    b = invoke("env", "presets", "--seed", "2").output.splitlines()
    changed = {x.split()[0] for x, y in zip(a, b) if x != y}
    assert changed == {"random", "color-v0"}


# --------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["collect", "data", "expert", "env"]),
        (["collect"], ["--out", "--seeds", "--colour-preset", "--noise", "--noise-seed", "--workers", "--max-steps", "--resume"]),
        (["data"], ["info"]),
        (["data", "info"], ["path", "Dataset folder", "--json", "--skip-bad"]),
        (["expert"], ["evaluate"]),
        (["expert", "evaluate"], ["--seeds", "--agent", "--colour-preset", "--workers", "--out"]),
        (["env"], ["presets"]),
        (["env", "presets"], ["--seed"]),
    ],
)
def test_help(args, expected):
    result = invoke(*args, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    for word in expected:
        assert word in result.output, word


def test_no_arguments_shows_help():
    result = invoke()
    assert "Usage:" in result.output and "collect" in result.output


def test_module_entry_point_runs_in_a_subprocess():
    result = subprocess.run([sys.executable, "-m", "nsacdrive.cli", "data", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "info" in result.stdout


@pytest.mark.parametrize("preset", [",", ""])
def test_collect_rejects_an_empty_colour_preset_list(tmp_path, preset):
    result = invoke("collect", "--seeds", "0", "--colour-preset", preset, "--out", tmp_path / "out", "--workers", "1")
    assert result.exit_code == 2
    assert "--colour-preset" in normalize(result.output)


# --------------------------------------------------------------------------- choices from the registries


def _choices():
    """(command, option, values) of every enumerated option, values read from the library."""
    from nsacdrive.agents.ppo_config import OBS_KINDS
    from nsacdrive.common.backends import BACKENDS
    from nsacdrive.controllers.precision import PRECISIONS
    from nsacdrive.controllers.registry import MODEL_BUILDERS
    from nsacdrive.data_collection.recorder import ENVS, LAYOUTS
    from nsacdrive.envs.car_racing import RENDERERS
    from nsacdrive.eval.modes import INFERENCE_MODES, OFFLINE_SPLITS, THROTTLE_MODES

    return [
        (["train"], "--model", tuple(MODEL_BUILDERS)),
        (["train"], "--precision", tuple(PRECISIONS)),
        (["sweep"], "--precision", tuple(PRECISIONS)),
        (["collect"], "--renderer", RENDERERS),
        (["collect"], "--env", ENVS),
        (["collect"], "--layout", LAYOUTS),
        (["expert", "train"], "--obs", OBS_KINDS),
        (["evaluate-offline"], "--split", OFFLINE_SPLITS),
        (["eval"], "--renderer", RENDERERS),
        (["eval"], "--inference", INFERENCE_MODES),
        (["eval"], "--backend", BACKENDS),
        (["udacity", "serve"], "--throttle", THROTTLE_MODES),
    ]


def wide_help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.output


def test_train_help_lists_every_registered_model():
    from nsacdrive.controllers.registry import MODEL_BUILDERS

    line = next(line for line in wide_help("train").splitlines() if "--model" in line)
    assert "<" + "|".join(MODEL_BUILDERS) + ">" in line
    assert len(MODEL_BUILDERS) == 8 and "nac" in MODEL_BUILDERS


@pytest.mark.parametrize(("command", "option", "values"), _choices(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_enumerated_option_lists_its_registry_in_help(command, option, values):
    line = next(line for line in wide_help(*command).splitlines() if f" {option} " in line)
    assert "<" + "|".join(values) + ">" in line


@pytest.mark.parametrize(("command", "option", "values"), _choices(), ids=lambda x: x if isinstance(x, str) else None)
def test_a_bad_enumerated_value_exits_2_naming_the_valid_ones(tmp_path, command, option, values):
    arguments = {"eval": [tmp_path / "run"], "evaluate-offline": [tmp_path / "run", "--data", tmp_path],
                 "udacity": [tmp_path / "run"]}.get(command[0], [])
    out = [] if command[0] == "udacity" else ["--out", tmp_path / "out"]
    result = invoke(*command, *arguments, *out, option, "bogus")
    assert result.exit_code == 2
    text = normalize(result.output)
    assert f"'{option}'" in text
    assert "'bogus' is not one of " + ", ".join(f"'{v}'" for v in values) in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["collect"], ["eval"], ["dagger"], ["drive"], ["expert", "evaluate"]])
def test_colour_preset_help_lists_every_preset(command):
    line = next(line for line in wide_help(*command).splitlines() if "--colour-preset" in line)
    assert ", ".join(list_presets()) in line


def test_the_command_line_starts_without_importing_torch():
    code = "import sys, nsacdrive.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------- outputs checked up front, OSErrors in one line


def _writing_commands(tmp_path: Path, out: Path) -> list[list]:
    """Every command that writes a folder, with ``out`` as that folder (other arguments need not exist)."""
    missing = tmp_path / "missing"
    return [
        ["collect", "--seeds", "0", "--out", out],
        ["expert", "train", "--out", out],
        ["drive", "--record", out],
        ["train", "--data", missing, "--out", out],
        ["evaluate-offline", missing, "--data", missing, "--out", out],
        ["eval", missing, "--out", out],
        ["plot", missing, "--out", out],
        ["report", missing, "--out", out],
        ["dagger", "--init", missing, "--out", out],
        ["udacity", "import", missing, "--out", out],
    ]


def _fail_if_work_starts(monkeypatch):
    def work(*args, **kwargs):
        raise AssertionError("the command started working")

    import nsacdrive.data_collection.recorder as recorder
    import nsacdrive.eval.closed_loop as closed_loop
    import nsacdrive.eval.offline as offline

    monkeypatch.setattr(recorder, "collect", work)
    monkeypatch.setattr(closed_loop, "evaluate_closed_loop", work)
    monkeypatch.setattr(offline, "evaluate_run", work)


WRITING_COMMANDS = ["collect", "expert-train", "drive", "train", "evaluate-offline", "eval", "plot", "report", "dagger",
                    "udacity-import"]


@pytest.mark.parametrize("index", range(len(WRITING_COMMANDS)), ids=WRITING_COMMANDS)
def test_an_out_that_is_a_file_fails_in_one_line_before_any_work(tmp_path, monkeypatch, index):
    _fail_if_work_starts(monkeypatch)
    target = tmp_path / "taken"
    target.write_text("a file, not a folder")
    command = _writing_commands(tmp_path, target)[index]
    result = invoke(*command)
    assert result.exit_code == 2
    option = "--record" if "--record" in command else "--out"
    assert result.output.strip() == f"error: {option}: {target} is a file, expected a folder"
    assert target.read_text() == "a file, not a folder"


@pytest.mark.parametrize("index", range(len(WRITING_COMMANDS)), ids=WRITING_COMMANDS)
def test_an_out_below_a_file_fails_in_one_line(tmp_path, monkeypatch, index):
    _fail_if_work_starts(monkeypatch)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    command = _writing_commands(tmp_path, blocker / "sub" / "out")[index]
    result = invoke(*command)
    assert result.exit_code == 2
    assert result.output.strip().endswith(f"{blocker / 'sub' / 'out'} cannot be created: {blocker} is a file")
    assert len(result.output.strip().splitlines()) == 1


def test_a_read_only_out_fails_in_one_line_and_creates_nothing(tmp_path, monkeypatch):
    import errno

    import nsacdrive.outputs as outputs

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    _fail_if_work_starts(monkeypatch)
    monkeypatch.setattr(outputs.tempfile, "TemporaryFile", read_only)
    result = invoke("eval", tmp_path / "run", "--out", tmp_path / "evaluation")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: --out: cannot write in {tmp_path} (Read-only file system)"
    assert not (tmp_path / "evaluation").exists()


@pytest.mark.parametrize(("command", "option"), [(["expert", "evaluate", "--out"], "--out"),
                                                 (["udacity", "serve", "run", "--log"], "--log")])
def test_a_file_output_that_is_a_folder_fails_in_one_line(tmp_path, command, option):
    result = invoke(*command, tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {option}: {tmp_path} is a folder, expected a file"


def test_an_os_error_inside_a_command_is_one_error_line_not_a_traceback(tmp_path, monkeypatch):
    import errno

    import nsacdrive.data_collection.recorder as recorder

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "manifest.json"))

    monkeypatch.setattr(recorder, "collect", full_disk)
    result = invoke("collect", "--seeds", "0", "--out", tmp_path / "out", "--workers", "1")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'out' / 'manifest.json'}: No space left on device"


# --------------------------------------------------------------------------- runs that cannot load fail up front


@pytest.fixture(scope="module")
def loadable_run(tmp_path_factory) -> Path:
    """A run folder with a tiny GMLE config and freshly initialised weights (never trained). Read-only."""
    from nsacdrive.controllers.checkpoint import WEIGHTS_FILE, save_weights, write_config
    from nsacdrive.controllers.encoders import EncoderConfig
    from nsacdrive.controllers.model_config import ModelConfig
    from nsacdrive.controllers.registry import build_controller
    from nsacdrive.controllers.train_config import TrainConfig

    run = tmp_path_factory.mktemp("runs") / "gmle"
    model = ModelConfig(model="gmle", encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4)
    config = TrainConfig(data="data", model=model, train_seeds="0", val_seeds="1", test_seeds="2")
    run.mkdir()
    write_config(run, config.to_dict())
    save_weights(build_controller(model), run / WEIGHTS_FILE)
    return run


def _broken_run(kind: str, good: Path, tmp_path: Path) -> tuple[Path, str]:
    """(run folder, expected reason) of a run broken in one way."""
    run = tmp_path / "broken"
    if kind == "missing folder":
        return tmp_path / "mistyped", "run folder does not exist"
    shutil.copytree(good, run)
    if kind == "missing config":
        (run / "config.json").unlink()
        return run, "config.json: config file is missing"
    if kind == "missing weights":
        (run / "model.safetensors").unlink()
        return run, "model.safetensors: weights file is missing"
    (run / "model.safetensors").write_bytes(b"not a safetensors file")
    return run, "model.safetensors"


RUN_FAULTS = ["missing folder", "missing config", "missing weights", "corrupt weights"]


@pytest.mark.parametrize("kind", RUN_FAULTS)
def test_eval_of_a_run_that_cannot_load_fails_before_driving(loadable_run, tmp_path, monkeypatch, kind):
    _fail_if_work_starts(monkeypatch)
    run, reason = _broken_run(kind, loadable_run, tmp_path)
    result = invoke("eval", loadable_run, run, "--seeds", "0", "--out", tmp_path / "evaluation")
    assert result.exit_code == 2
    text = result.output.strip()
    assert text.startswith(f"error: cannot load run {run}: ") and reason in text and len(text.splitlines()) == 1
    assert not (tmp_path / "evaluation").exists()


@pytest.mark.parametrize("kind", RUN_FAULTS)
def test_evaluate_offline_of_a_run_that_cannot_load_fails_before_computing(loadable_run, tmp_path, monkeypatch, kind):
    _fail_if_work_starts(monkeypatch)
    run, reason = _broken_run(kind, loadable_run, tmp_path)
    result = invoke("evaluate-offline", loadable_run, run, "--data", tmp_path, "--out", tmp_path / "table")
    assert result.exit_code == 2
    assert result.output.startswith(f"error: cannot load run {run}: ") and reason in result.output


# --------------------------------------------------------------------------- worker fork server

@pytest.mark.parametrize("command, options, starts", [
    ("eval", ["--workers", "2"], True),
    ("eval", ["--workers", "1", "--inference", "process"], True),
    ("eval", ["--workers", "1", "--inference", "inline"], False),
    ("eval", ["--workers", "2", "--backend", "ray"], False),
    ("dagger", ["--workers", "2"], True),
    ("dagger", ["--workers", "1"], False),
])
def test_commands_that_fork_workers_start_their_server_first(command, options, starts, tmp_path, monkeypatch):
    started: list[str] = []
    monkeypatch.setattr("nsacdrive.cli.start_worker_server", started.append)
    missing = tmp_path / "no-such-run"
    target = [missing] if command == "eval" else ["--init", missing]
    result = invoke(command, *target, *options, "--out", tmp_path / "out")
    assert result.exit_code != 0  # the run is missing: the command stops after the server's start
    assert started == (["nsacdrive.eval.dagger"] if starts else [])


def test_the_servers_module_holds_the_closed_loop_and_dagger_workers_tasks():
    from nsacdrive.data_collection.recorder import record_episode
    from nsacdrive.eval.closed_loop import _groups_worker
    from nsacdrive.run_loading import WORKER_TASKS_MODULE

    code = (f"import sys, {WORKER_TASKS_MODULE}; "
            f"print(*(name in sys.modules for name in ({_groups_worker.__module__!r}, {record_episode.__module__!r}, 'torch')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["True"] * 3


# --------------------------------------------------------------------------- bad input: one line, exit 2, nothing half-made


needs_no_cuda = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")


@needs_no_cuda
@pytest.mark.parametrize("command", [["train", "--data", "DATA", "--epochs", "1"], ["eval", "RUN", "--seeds", "1000"]])
def test_a_device_this_machine_lacks_fails_before_any_work(tmp_path, command):
    args = [str(tmp_path / "data") if a == "DATA" else str(tmp_path / "run") if a == "RUN" else a for a in command]
    result = invoke(*args, "--device", "cuda", "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert normalize(result.output).startswith("error: --device cuda: CUDA is not available on this machine (torch ")
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("content", "kind"), [("[1, 2]", "list"), ('"configs/demo.json"', "str"), ("3", "int")])
def test_a_config_file_that_is_no_object_is_named(tmp_path, content, kind):
    (tmp_path / "config.json").write_text(content)
    result = invoke("train", "--data", tmp_path / "data", "--config", tmp_path / "config.json", "--out", tmp_path / "run")
    assert result.exit_code == 2
    assert f"must hold a JSON object of training config fields (configs/demo.json is one), got a {kind}" in normalize(result.output)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field", ["batch_size", "max_batches_per_epoch", "epochs"])
def test_counts_beyond_any_training_are_refused_before_the_run_folder_is_made(tmp_path, field):
    for seed in range(3):
        write_synthetic(tmp_path / "data", f"ep{seed}", 60, track_seed=seed, textured=False)
    (tmp_path / "config.json").write_text(f'{{"{field}": 1000000000000000000000000000000}}')
    result = invoke("train", "--data", tmp_path / "data", "--config", tmp_path / "config.json", "--out", tmp_path / "run")
    assert result.exit_code == 2
    assert normalize(result.output) == f"error: training config {field} must be in [1, 1000000], got 1000000000000000000000000000000"
    assert not (tmp_path / "run").exists()


def test_a_run_that_fails_in_its_first_epoch_leaves_no_run_folder(tmp_path):
    for seed in range(3):
        write_synthetic(tmp_path / "data", f"ep{seed}", 60, track_seed=seed, textured=False)
    result = invoke("train", "--data", tmp_path / "data", "--out", tmp_path / "run", "--epochs", "1", "--device", "cpu",
                    "--batch-size", "4", "--max-batches-per-epoch", "1", "--config", _diverging(tmp_path))
    assert result.exit_code == 2 and "the loss is nan" in normalize(result.output)
    assert not (tmp_path / "run").exists()


def _diverging(tmp_path: Path) -> Path:
    (tmp_path / "diverging.json").write_text(json.dumps({"lr": 1e12, "model": {"model": "gmle", "d_model": 16, "num_heads": 4, "topk": 4,
                                                                                 "encoder": {"token_dim": 16, "channels": [8, 16, 16]}}}))
    return tmp_path / "diverging.json"


def test_resume_removes_what_a_killed_write_left_in_the_run_folder(tmp_path):
    for seed in range(3):
        write_synthetic(tmp_path / "data", f"ep{seed}", 60, track_seed=seed, textured=False)
    args = ["train", "--data", tmp_path / "data", "--out", tmp_path / "run", "--epochs", "1", "--device", "cpu",
            "--batch-size", "4", "--max-batches-per-epoch", "1"]
    assert invoke(*args).exit_code == 0
    stale = tmp_path / "run" / ".model.safetensors.k2x9.partial"  # a kill between a temporary file's write and its rename
    stale.write_bytes(b"half")
    result = invoke(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert not stale.exists()


def test_a_run_whose_config_asks_for_a_giant_model_is_refused_before_it_is_built(loadable_run, tmp_path):
    run = _copy(loadable_run, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_model"] = 10**9  # 10^18 attention weights: refused before any is allocated
    (run / "config.json").write_text(json.dumps(config))
    result = invoke("eval", run, "--seeds", "1000", "--out", tmp_path / "eval")
    assert result.exit_code == 2
    assert "model config d_model must be in [1, 4096], got 1000000000" in normalize(result.output)
    assert not (tmp_path / "eval").exists()
