"""The Extending pages: each page's one Python example runs as printed, and what it registers
reaches the parts of the package that read the table it joined.

Registrations change module-level tables; the ``keep`` fixture puts each table back as it was,
so no other test sees an example's additions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "extending"


def page_example(page: str, replacements: dict[str, str] | None = None) -> str:
    """The one ```python block of ``docs/extending/PAGE``, with each key of ``replacements`` (a
    real-looking path or size that must appear in it) replaced by its value."""
    blocks = re.findall(r"```python\n(.*?)```", (PAGES / page).read_text(), re.DOTALL)
    assert len(blocks) == 1, f"{page}: expected one python example, found {len(blocks)}"
    code = blocks[0]
    for old, new in (replacements or {}).items():
        assert old in code, f"{page}: the example no longer holds {old!r}"
        code = code.replace(old, new)
    return code


def run_example(page: str, replacements: dict[str, str] | None = None) -> dict[str, Any]:
    """Execute the page's example as a script; returns its globals."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(page_example(page, replacements), f"docs/extending/{page}", "exec"), namespace)
    return namespace


@pytest.fixture
def keep() -> Iterator[Callable[..., None]]:
    """``keep(table, ...)``: these dicts and lists get their present contents back after the test."""
    saved: list[tuple[Any, Any]] = []
    yield lambda *tables: saved.extend((table, table.copy()) for table in tables)
    for table, contents in reversed(saved):
        table.clear()
        (table.update if isinstance(table, dict) else table.extend)(contents)


# ------------------------------------------------------------------------------ monitor score


def test_the_monitor_score_example_registers_a_score_the_monitors_use(keep, capsys):
    from nsacdrive.eval.closed_loop import DriveConfig
    from nsacdrive.eval.monitor import MonitorConfig, episode_scores
    from nsacdrive.eval.monitor_scores import SCORE_INPUTS, SCORES, score_inputs

    keep(SCORES, SCORE_INPUTS)
    run_example("monitor-score.md")
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "[0.06 0.1  0.18 0.4  0.94 2.  ]"
    assert [line.split()[-1] for line in printed[2:]] == ["ok"] * 4 + ["ALARM"] * 2
    assert SCORES["steer_cv"][1] is True and score_inputs("steer_cv") == ()
    assert DriveConfig(monitor_score="steer_cv", monitor_threshold=0.5).monitor_score == "steer_cv"

    n = 40  # the offline judge scores a whole episode with it, beside the built-in scores
    log = {"aleatoric": np.full((n, 3), 0.01), "epistemic": np.zeros((n, 3)), "raw_action": np.tile([0.2, 0.5, 0.0], (n, 1)),
           "speed": np.full(n, 30.0), "progress": np.linspace(0, 40, n), "lateral_error": np.zeros(n), "heading_error": np.zeros(n)}
    scored = episode_scores({"episode_id": "e0", "colour_preset": "default", "track_seed": 0, "reason": "time_limit"},
                            log, MonitorConfig())
    assert {"steer_cv", "steer_std", "abs_steer"} <= set(scored.scores)
    np.testing.assert_allclose(scored.scores["steer_cv"], 0.1 / 0.25)


def test_a_score_is_registered_once_and_may_need_log_fields(keep):
    from nsacdrive.eval.monitor_scores import SCORE_INPUTS, SCORES, register_score, score_inputs

    keep(SCORES, SCORE_INPUTS)
    with pytest.raises(ValueError, match="'steer_std' is already registered"):
        register_score("steer_std", "again", True, lambda arrays: arrays["speed"])
    register_score("density_per_speed", "density over speed", True, lambda a: a["density"] / (a["speed"] + 1), needs=["density"])
    assert score_inputs("density_per_speed") == ("density",)


# ------------------------------------------------------------------------------ corruption


def test_the_corruption_example_adds_a_family_the_suite_parses_and_applies(keep, capsys):
    from nsacdrive.envs.corruptions import CORRUPTIONS, FAMILIES, SEVERITIES, parse_corruptions
    from nsacdrive.eval.closed_loop import EvalConfig

    keep(CORRUPTIONS)
    built_in = list(FAMILIES)
    run_example("corruption.md")
    listing, applied, same, other = capsys.readouterr().out.splitlines()
    name, _, centre, _, corner = applied.split()
    assert listing.split()[0] == "vignette" and name == "vignette-3" and int(corner) < int(centre) - 50  # the corners darkened
    assert same.endswith("True") and other.endswith("True")
    assert list(FAMILIES) == [*built_in, "vignette"]
    assert [spec.name for spec in parse_corruptions("all-5")][-1] == "vignette-5"
    assert len(parse_corruptions("all")) == len(SEVERITIES) * (len(built_in) + 1)

    (spec,) = parse_corruptions("vignette-5")  # the front camera's frames too, at any severity
    frame = np.full((160, 320, 3), 180, dtype=np.uint8)
    np.testing.assert_array_equal(spec(frame, seed=1, step=2), spec(frame, seed=1, step=2))
    assert spec(frame, seed=1, step=2)[0, 0, 0] < parse_corruptions("vignette-1")[0](frame, seed=1, step=2)[0, 0, 0]
    assert EvalConfig(runs=("runs/nsac",), seeds=(0,), corruptions=("none", "vignette-3")).corruptions[1] == "vignette-3"


def test_a_corruption_is_registered_once_under_a_parseable_name_with_five_levels(keep):
    from nsacdrive.envs.corruptions import CORRUPTIONS, register_corruption

    keep(CORRUPTIONS)
    identity = lambda frame, level, rng: frame  # noqa: E731
    with pytest.raises(ValueError, match="'fog' is already registered"):
        register_corruption("fog", identity, (1, 2, 3, 4, 5), "again")
    for name in ("", "all", "none", "two,families", "with space"):
        with pytest.raises(ValueError, match="free of commas"):
            register_corruption(name, identity, (1, 2, 3, 4, 5), "bad name")
    with pytest.raises(ValueError, match="one level per severity"):
        register_corruption("identity", identity, (1, 2, 3), "three levels")
    assert "identity" not in CORRUPTIONS


# ------------------------------------------------------------------------------ agent


def test_the_agent_example_records_an_episode_with_its_constant_action(tmp_path, capsys):
    out = tmp_path / "constant"
    namespace = run_example("agent.md", {"data/constant": str(out)})
    episode, actions, speed = capsys.readouterr().out.splitlines()
    assert episode == "1 episode: constant-0.5_default_seed000003 constant 40 steps"
    assert actions == "actions: [[0.0, 0.5, 0.0]]" and float(speed.split()[-1]) > 0
    sidecar, arrays = namespace["sidecar"], namespace["arrays"]
    assert sidecar["agent_spec"] == "constant:0.5" and sidecar["agent"] == {"agent_id": "constant-0.5", "throttle": 0.5}
    np.testing.assert_array_equal(arrays["expert_actions"], np.tile(np.float32([0.0, 0.5, 0.0]), (40, 1)))
    with pytest.raises(ValueError, match="listed twice"):
        namespace["kinds"].with_kind("expert", namespace["constant_agent"])


# ------------------------------------------------------------------------------ model


def test_the_model_example_registers_a_head_that_trains_reloads_and_predicts(keep, tmp_path, capsys):
    from data_fixtures import write_synthetic

    from nsacdrive.controllers.model_config import ModelConfig
    from nsacdrive.controllers.model_names import MODEL_NAMES, REGISTERED_MODEL_NAMES
    from nsacdrive.controllers.registry import MODEL_BUILDERS

    keep(MODEL_BUILDERS, REGISTERED_MODEL_NAMES)
    with pytest.raises(ValueError, match="unknown model 'pooled'"):
        ModelConfig(model="pooled")
    for seed in range(3):  # untextured synthetic demonstrations on track seeds 0, 1, 2: no env needed
        write_synthetic(tmp_path / "demos", f"ep{seed}", 60, track_seed=seed, textured=False)
    run_example("model.md", {"data/demos": str(tmp_path / "demos"), "runs/pooled": str(tmp_path / "pooled")})
    assert capsys.readouterr().out.splitlines() == ["epoch 1 validation loss finite: True", "pooled PooledGaussianHead (1, 3)"]
    assert (tmp_path / "pooled" / "model.safetensors").is_file()
    assert "pooled" in MODEL_BUILDERS and "pooled" not in MODEL_NAMES  # the command line keeps the built-in names
    with pytest.raises(ValueError, match="expected one of .*pooled"):
        ModelConfig(model="pooledd")
    with pytest.raises(ValueError, match="censored pedal likelihood"):
        ModelConfig(model="pooled", pedal_likelihood="censored")


def test_a_model_is_registered_once(keep):
    from nsacdrive.controllers.model_names import REGISTERED_MODEL_NAMES
    from nsacdrive.controllers.registry import MODEL_BUILDERS, register_model

    keep(MODEL_BUILDERS, REGISTERED_MODEL_NAMES)
    for name in ("nsac", "ensemble"):
        with pytest.raises(ValueError, match=f"model '{name}' is already registered"):
            register_model(name, MODEL_BUILDERS["gmle"])
    with pytest.raises(ValueError, match="non-empty"):
        register_model("", MODEL_BUILDERS["gmle"])
    assert REGISTERED_MODEL_NAMES == []


# ------------------------------------------------------------------------------ environment


def test_the_environment_example_records_trains_and_drives_in_grey(keep, tmp_path, capsys):
    from nsacdrive.controllers.model_config import ModelConfig
    from nsacdrive.data_collection.dataset import DatasetError, SequenceDataset
    from nsacdrive.data_collection.episode import read_sidecar
    from nsacdrive.data_collection.recorder import ENVS
    from nsacdrive.envs.observation import PREPROCESS_VERSION
    from nsacdrive.envs.observation_kinds import ENV_MAKERS, OBSERVATION_KINDS, RECORDING_ENVS

    keep(OBSERVATION_KINDS, RECORDING_ENVS, ENV_MAKERS)
    data, run = tmp_path / "grey", tmp_path / "run"
    run_example("environment.md", {"data/grey": str(data), "runs/grey": str(run)})
    assert capsys.readouterr().out.splitlines() == [
        "check_env: passed",
        "expert_default_seed000000_carracing-grey carracing-grey (61, 96, 96, 3) grey: True",
        "expert_default_seed000001_carracing-grey carracing-grey (61, 96, 96, 3) grey: True",
        "trained on carracing-grey for 1 epoch",
        "drove 20 steps in carracing-grey grey: True",
    ]
    assert "carracing-grey" in ENVS and ModelConfig(observation="carracing-grey").encoder.kind == "cnn"
    sidecars = [read_sidecar(path) for path in sorted(data.glob("expert_*.json"))]
    assert [(s["track_seed"], s["frame_kind"], s["preprocess"]) for s in sidecars] == [
        (0, "carracing-grey", PREPROCESS_VERSION), (1, "carracing-grey", PREPROCESS_VERSION)]
    assert len(SequenceDataset(data, observation="carracing-grey", skip_intro=0)) > 0
    with pytest.raises(DatasetError, match="holds carracing-grey frames"):
        SequenceDataset(data, observation="carracing")


def test_an_environment_is_registered_once_with_carracing_underneath(keep):
    import dataclasses

    import gymnasium as gym

    from nsacdrive.envs.car_racing import make_car_racing
    from nsacdrive.envs.observation_kinds import (
        ENV_MAKERS,
        OBSERVATION_KINDS,
        RECORDING_ENVS,
        make_env_for,
        register_observation_kind,
    )

    keep(OBSERVATION_KINDS, RECORDING_ENVS, ENV_MAKERS)
    carracing = OBSERVATION_KINDS["carracing"]
    with pytest.raises(ValueError, match="observation kind 'carracing' is already registered"):
        register_observation_kind(carracing, make_car_racing)
    with pytest.raises(ValueError, match="env 'udacity-style' is already registered"):
        register_observation_kind(dataclasses.replace(carracing, name="front", env="udacity-style"), make_car_racing)
    with pytest.raises(ValueError, match="free of"):
        register_observation_kind(dataclasses.replace(carracing, name="slashed", env="car/racing"), make_car_racing)
    assert (len(OBSERVATION_KINDS), len(RECORDING_ENVS), len(ENV_MAKERS)) == (2, 2, 1)

    register_observation_kind(dataclasses.replace(carracing, name="pole", env="pole"), lambda **settings: gym.make("CartPole-v1"))
    with pytest.raises(TypeError, match="env 'pole': env.unwrapped must be nsacdrive's CarRacing .*got CartPoleEnv"):
        make_env_for("pole", "default", 10)
