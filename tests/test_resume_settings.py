"""Resuming refuses changed settings: a folder records the settings that shape its results, and
``collect``/``eval`` on it with another value for one of them stop with a message naming it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest
from data_fixtures import normalize
from run_fixtures import tiny_run
from typer.testing import CliRunner

from nsacdrive.cli import app
from nsacdrive.common.resume import SETTINGS_FILE, SettingChange, SettingsChanged, check_settings, record_settings
from nsacdrive.data_collection.recorder import CollectConfig, MixingConfig, NoiseConfig, collect
from nsacdrive.data_collection.summary import summarize
from nsacdrive.eval.closed_loop import DriveConfig, EvalConfig, evaluate_closed_loop

# ------------------------------------------------------------------------------ the mechanism


@dataclass(frozen=True)
class Inner:
    depth: int = 2


@dataclass(frozen=True)
class Job:
    name: str
    steps: int = 10
    inner: Inner = field(default_factory=Inner)
    threads: int = 1  # not recorded: it does not change results


FIELDS = ("name", "steps", "inner")


def test_the_same_settings_resume(tmp_path):
    record_settings(tmp_path, Job("a"), FIELDS)
    assert json.loads((tmp_path / SETTINGS_FILE).read_text()) == {"name": "a", "steps": 10, "inner": {"depth": 2}}
    check_settings(tmp_path, Job("a", threads=8), FIELDS)


def test_a_changed_setting_is_named_with_both_values(tmp_path):
    record_settings(tmp_path, Job("a"), FIELDS)
    with pytest.raises(SettingsChanged, match=r"holds results made with other settings \(steps 10 recorded, 20 now; "
                                              r"inner\.depth 2 recorded, 3 now\)") as caught:
        check_settings(tmp_path, Job("a", steps=20, inner=Inner(3)), FIELDS)
    assert caught.value.changes == (SettingChange("steps", 10, 20), SettingChange("inner.depth", 2, 3))
    assert caught.value.path == tmp_path / SETTINGS_FILE


def test_a_refusal_reads_in_the_librarys_terms_or_with_the_flags_of_a_command_line(tmp_path):
    refusal = SettingsChanged(tmp_path / SETTINGS_FILE, [SettingChange("steps", 10, 20), SettingChange("inner.depth", None, [2, 3])])
    assert str(refusal) == refusal.describe() == (f"{tmp_path} holds results made with other settings "
                                                 "(steps 10 recorded, 20 now; inner.depth None recorded, [2, 3] now); "
                                                 "use the recorded settings or another output folder")
    assert refusal.describe({"steps": "--steps"}, folder="--out") == (
        f"{tmp_path} holds results made with other settings (--steps 10 there, 20 now; inner.depth unset there, 2,3 now); "
        "use the recorded settings or another --out")


def test_a_field_the_record_predates_compares_at_its_default(tmp_path):
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"name": "a", "inner": {"depth": 2}, "removed_since": 1}))
    check_settings(tmp_path, Job("a"), FIELDS)  # steps: not recorded, default 10 = the current value
    with pytest.raises(SettingsChanged, match="steps 10 recorded, 11 now"):
        check_settings(tmp_path, Job("a", steps=11), FIELDS)


def test_a_folder_without_a_record_resumes_and_a_broken_one_is_named(tmp_path):
    check_settings(tmp_path, Job("a"), FIELDS)
    (tmp_path / SETTINGS_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"\.settings\.json: unreadable settings record"):
        check_settings(tmp_path, Job("a"), FIELDS)


@dataclass(frozen=True)
class Strict:
    """A config that takes only what it declares: a nested field given as a dict is refused."""

    inner: Inner = field(default_factory=Inner)
    extra: Inner | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Inner) or not isinstance(self.extra, Inner | None):
            raise TypeError(f"expected Inner configs, got {self.inner!r} and {self.extra!r}")


NESTED = ("inner", "extra")


def test_recorded_nested_settings_are_rebuilt_as_their_configs_and_compared_field_by_field(tmp_path):
    record_settings(tmp_path, Strict(Inner(3), Inner(4)), NESTED)
    check_settings(tmp_path, Strict(Inner(3), Inner(4)), NESTED)
    with pytest.raises(SettingsChanged) as caught:
        check_settings(tmp_path, Strict(Inner(3), Inner(5)), NESTED)
    assert caught.value.changes == (SettingChange("extra.depth", 4, 5),)


def test_an_optional_nested_setting_given_on_one_side_only_is_reported(tmp_path):
    record_settings(tmp_path, Strict(), NESTED)
    with pytest.raises(SettingsChanged) as caught:
        check_settings(tmp_path, Strict(extra=Inner(2)), NESTED)
    assert caught.value.changes == (SettingChange("extra", None, {"depth": 2}),)
    record_settings(tmp_path, Strict(extra=Inner(2)), NESTED)
    with pytest.raises(SettingsChanged) as caught:
        check_settings(tmp_path, Strict(), NESTED)
    assert caught.value.changes == (SettingChange("extra", {"depth": 2}, None),)


def test_a_recorded_nested_setting_with_unknown_fields_is_an_unreadable_record(tmp_path):
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"inner": {"depth": 2, "width": 1}, "extra": None}))
    with pytest.raises(ValueError, match=r"unreadable settings record \(ValueError: inner: unknown fields \['width'\]"):
        check_settings(tmp_path, Strict(), NESTED)


def test_collect_and_eval_configs_compare_their_recorded_nested_settings(tmp_path):
    mixing = MixingConfig(learner="controller:runs/a", beta=0.5, source="dagger-round-1")
    collecting = CollectConfig(agent="expert", seeds=[3], mixing=mixing)
    record_settings(tmp_path / "collect", collecting, CollectConfig.FOLDER_FIELDS)
    check_settings(tmp_path / "collect", collecting, CollectConfig.FOLDER_FIELDS)
    with pytest.raises(SettingsChanged, match="mixing.beta 0.5 recorded, 0.25 now"):
        check_settings(tmp_path / "collect", dataclasses.replace(collecting, mixing=dataclasses.replace(mixing, beta=0.25)),
                       CollectConfig.FOLDER_FIELDS)
    evaluating = EvalConfig(runs=["runs/a"], seeds=[3], drive=DriveConfig(max_steps=10, samples=2))
    record_settings(tmp_path / "eval", evaluating, EvalConfig.EPISODE_FIELDS)
    check_settings(tmp_path / "eval", evaluating, EvalConfig.EPISODE_FIELDS)
    with pytest.raises(SettingsChanged, match="drive.samples 2 recorded, 3 now"):
        check_settings(tmp_path / "eval", dataclasses.replace(evaluating, drive=DriveConfig(max_steps=10, samples=3)),
                       EvalConfig.EPISODE_FIELDS)


# ------------------------------------------------------------------------------ collect

STEPS = 20


def recording(**settings) -> CollectConfig:
    return CollectConfig(**{"agent": "expert", "seeds": [3], "max_steps": STEPS, **settings})


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recorded")
    collect(recording(), folder, progress=False)
    return folder


@pytest.mark.parametrize(("changed", "message"), [
    ({"max_steps": 30}, "max_steps 20 recorded, 30 now"),
    ({"renderer": "stock"}, "renderer 'fast' recorded, 'stock' now"),
])
def test_collect_resume_refuses_settings_that_change_episodes(recorded, changed, message):
    before = sorted(p.name for p in recorded.iterdir())
    with pytest.raises(SettingsChanged, match=message):
        collect(recording(seeds=[3, 4], **changed), recorded, resume=True, progress=False)
    assert sorted(p.name for p in recorded.iterdir()) == before  # nothing recorded


def test_collect_adds_seeds_noise_and_workers_to_a_folder(tmp_path):
    collect(recording(), tmp_path, progress=False)
    summary = collect(recording(seeds=[3, 4], noise=NoiseConfig(0.2), workers=2), tmp_path, resume=True, progress=False)
    assert (summary.written, summary.skipped) == (2, 0)  # noisy episodes have their own ids
    assert summarize(tmp_path).to_dict()["episodes"] == 3  # the settings record is no episode


def test_cli_collect_resume_names_the_changed_flag(tmp_path):
    runner = CliRunner()
    common = ["collect", "--seeds", "3", "--workers", "1", "--out", str(tmp_path)]
    assert runner.invoke(app, [*common, "--max-steps", str(STEPS)]).exit_code == 0
    result = runner.invoke(app, [*common, "--max-steps", "25", "--renderer", "stock", "--resume"])
    assert result.exit_code == 2
    assert normalize(result.output).startswith(f"error: {tmp_path} holds results made with other settings "
                                               "(--max-steps 20 there, 25 now; --renderer fast there, stock now)")


def test_cli_collect_into_a_dagger_round_folder_names_daggers_mixing(tmp_path):
    mixing = MixingConfig(learner="controller:runs/a", beta=0.5, source="dagger-round-1")
    record_settings(tmp_path, CollectConfig(agent="expert", seeds=[3], max_steps=STEPS, mixing=mixing), CollectConfig.FOLDER_FIELDS)
    result = CliRunner().invoke(app, ["collect", "--seeds", "3", "--max-steps", str(STEPS), "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 2
    assert normalize(result.output).startswith(f"error: {tmp_path} holds results made with other settings (DAgger's mixing "
                                               "{'learner': 'controller:runs/a', 'beta': 0.5, 'source': 'dagger-round-1'} there, unset now)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [SETTINGS_FILE]  # nothing recorded


# ------------------------------------------------------------------------------ eval


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("resume_settings"))


def evaluation(run, **settings) -> EvalConfig:
    drive = DriveConfig(**{"max_steps": 10, **settings.pop("drive", {})})
    return EvalConfig(**{"runs": [run], "seeds": [3, 4], "batch": 1, "drive": drive, **settings})


@pytest.fixture(scope="module")
def evaluated(trained_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("evaluated")
    evaluate_closed_loop(evaluation(trained_run), folder, progress=False)
    return folder


@pytest.mark.parametrize(("changed", "message"), [
    ({"drive": {"max_steps": 12}}, "drive.max_steps 10 recorded, 12 now"),
    ({"drive": {"samples": 3}}, "drive.samples None recorded, 3 now"),
    ({"drive": {"throttle_cap": 0.1}}, "drive.throttle_cap None recorded, 0.1 now"),
    ({"drive": {"pedal_caution": 0.5}}, "drive.pedal_caution None recorded, 0.5 now"),
    ({"drive": {"pedal_caution": 0.5, "gas_caution": 0.0}}, "drive.gas_caution None recorded, 0.0 now"),
    ({"seeds": [3, 5]}, r"seeds \[3, 4\] recorded, \[3, 5\] now"),
    ({"batch": 2}, "batch 1 recorded, 2 now"),
])
def test_eval_resume_refuses_settings_that_change_episodes(trained_run, evaluated, changed, message):
    aggregates = (evaluated / "aggregates.json").read_bytes()
    with pytest.raises(SettingsChanged, match=message):
        evaluate_closed_loop(evaluation(trained_run, **changed), evaluated, resume=True, progress=False)
    assert (evaluated / "aggregates.json").read_bytes() == aggregates


def test_eval_resumes_with_other_workers_and_inference(trained_run, tmp_path):
    evaluate_closed_loop(evaluation(trained_run), tmp_path, progress=False)
    lost = tmp_path / "episodes" / "run_default_seed000004_r0.json"
    logged = json.loads(lost.read_text())
    lost.unlink()
    config = dataclasses.replace(evaluation(trained_run), workers=2, inference="process")
    evaluate_closed_loop(config, tmp_path, resume=True, progress=False)
    assert json.loads(lost.read_text()) == logged


def test_eval_without_resume_starts_an_empty_folder_afresh(trained_run, tmp_path):
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"batch": 5}))  # a killed start, no episode finished
    evaluate_closed_loop(evaluation(trained_run, seeds=[3]), tmp_path, progress=False)
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["batch"] == 1


def test_cli_eval_resume_names_the_changed_flags(trained_run, evaluated):
    result = CliRunner().invoke(app, ["eval", str(trained_run), "--seeds", "3,4", "--batch", "1", "--max-steps", "12",
                                      "--samples", "2", "--out", str(evaluated), "--resume", "--workers", "1"])
    assert result.exit_code == 2
    assert normalize(result.output).startswith(f"error: {evaluated} holds results made with other settings "
                                               "(--max-steps 10 there, 12 now; --samples unset there, 2 now)")


def test_cli_eval_gas_caution_needs_pedal_caution(trained_run, tmp_path):
    result = CliRunner().invoke(app, ["eval", str(trained_run), "--seeds", "3", "--gas-caution", "0", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "gas_caution must be >= 0 and goes with pedal_caution, got 0.0 with pedal_caution None" in normalize(result.output)
    assert not (tmp_path / "out" / "episodes").exists()
