"""Every field of the training, model, encoder, augmentation, attention, recording and human-drive
configs is type- and range-checked, and the message names the field, what was expected and the value given."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsacdrive.common.config_checks import Range, check_fields, config_from_dict
from nsacdrive.controllers.augment import AugmentConfig
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.nsac import NACConfig, NSACConfig
from nsacdrive.controllers.robust_augment import RobustAugmentConfig
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.udacity_augment import UdacityAugmentConfig
from nsacdrive.data_collection.human import HumanDriveConfig
from nsacdrive.data_collection.recorder import CollectConfig

#: each config class with the fields it needs to build
CONFIGS: dict[type, dict[str, Any]] = {
    TrainConfig: {"data": "data/demos"},
    ModelConfig: {},
    EncoderConfig: {},
    AugmentConfig: {},
    UdacityAugmentConfig: {},
    RobustAugmentConfig: {},
    NSACConfig: {"input_dim": 8, "d_model": 8, "num_heads": 2},
    NACConfig: {"input_dim": 8, "d_model": 8, "num_heads": 2},
    CollectConfig: {"agent": "expert", "seeds": (0,)},
    HumanDriveConfig: {},
}

#: one value outside the allowed range for every bounded numeric field
OUT_OF_RANGE: dict[type, dict[str, Any]] = {
    TrainConfig: {"sequence_length": 0, "frame_stride": 0, "batch_size": 0, "epochs": 0, "max_batches_per_epoch": 0, "min_batches_per_epoch": 0,
                  "max_val_batches": 0, "lr": 0.0, "weight_decay": -1e-4, "plateau_factor": 1.0, "plateau_patience": -1,
                  "early_stopping_patience": 0, "grad_clip": 0, "perturb_std": -0.1, "twin_fraction": 0.0, "ema_decay": 1.0, "cache_episodes": 0, "seed": -1,
                  "consistency": -0.5, "robust_members": 0},
    ModelConfig: {"d_model": 0, "num_heads": 0, "topk": 0, "bn_std": -1.0, "train_samples": 0, "predict_samples": 0,
                  "lambda_reg": -0.5, "epistemic_margin": -0.05, "dropout": 1.0, "nll_beta": 1.5, "members": 0, "evidential_coeff": -0.01, "sde_depth": 0,
                  "sde_sigma_max": -0.5, "levy_frames": 0, "levy_window": 0.0, "levy_sharpness": 60.0,
                  "camera_fov": 5.0},
    EncoderConfig: {"token_dim": 0, "channels": (8, 16, 0)},
    AugmentConfig: {"probability": 1.5, "hue": -1.0, "saturation": -0.4, "contrast": -0.3, "brightness": -0.15, "channel_gain": -0.1,
                    "recolour": 1.5},
    UdacityAugmentConfig: {"probability": -0.1, "camera_offset": -0.2, "translate_x": -1.0, "translate_y": -1.0,
                           "steer_per_pixel": -0.002, "shadow_lightness": (-0.2, 0.5), "brightness": (-0.8, 1.2)},
    RobustAugmentConfig: {"probability": 1.5, "shift": 0.6, "rotation": 50.0, "scale": -0.1, "flip": 1.5, "gamma": 2.5, "blur": 4.0,
                          "noise": 0.6, "random_conv": -0.1, "erase": 1.5, "erase_area": 0.6},
    NSACConfig: {"input_dim": 0, "topk": 0, "output_dim": 0, "bn_std": -1.0, "sparsity": 1.5, "wiring_seed": -1, "tau_epsilon": 0.0, "dropout": 1.0},
    NACConfig: {"input_dim": 0, "topk": 0, "sparsity": -0.5, "wiring_seed": -1, "tau_epsilon": -1e-6, "dropout": -0.1},
    CollectConfig: {"max_steps": 0, "workers": 0, "side_offset": 0.0, "camera_fov": 5.0},
    HumanDriveConfig: {"seed": -1, "slow_motion": 0.5, "max_steps": 0, "max_episodes": 0, "window_scale": 0, "camera_fov": 160.0},
}
#: numeric fields without a range (any finite value is meaningful)
UNBOUNDED = {(TrainConfig, "perturb_mean"), (NSACConfig, "bn_mean"), (NSACConfig, "a0"),
             (NSACConfig, "d_model"), (NSACConfig, "num_heads"), (NACConfig, "d_model"), (NACConfig, "num_heads"),
             (NACConfig, "euler_steps"), (NACConfig, "delta_t"), (CollectConfig, "seeds")}


def base_type(annotation: Any) -> Any:
    """``X | None`` → X; other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def wrong_values(annotation: Any) -> list[Any]:
    """JSON values of the wrong type for a field annotated ``annotation``."""
    kind = base_type(annotation)
    optional = kind is not annotation
    origin = typing.get_origin(kind)
    if kind is int:
        values = ["2", 0.5, True]
    elif kind is float:
        values = ["0.1", True, float("nan"), float("inf")]
    elif kind is bool:
        values = [1, "true"]
    elif kind is str:
        values = [5, ["a"]]
    elif origin is tuple:
        values = ["ab", 5]
    elif origin is typing.Literal:
        values = ["nope", 1]
    else:  # a nested config
        values = ["x", 5]
    return values if optional else [*values, None]


def field_cases() -> list[tuple[type, str, Any]]:
    cases = []
    for cls in CONFIGS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            cases += [(cls, f.name, value) for value in wrong_values(hints[f.name])]
    return cases


def build(cls: type, **fields: Any) -> Any:
    return cls(**{**CONFIGS[cls], **fields})


@pytest.mark.parametrize(("cls", "name", "value"), field_cases(), ids=lambda v: repr(v) if not isinstance(v, type) else v.__name__)
def test_every_field_rejects_a_value_of_the_wrong_type_naming_field_and_value(cls, name, value):
    with pytest.raises(ValueError) as caught:
        build(cls, **{name: value})
    assert name in str(caught.value) and f"got {value!r}" in str(caught.value)


@pytest.mark.parametrize(("cls", "name", "value"), [(cls, name, value) for cls, table in OUT_OF_RANGE.items() for name, value in table.items()])
def test_every_bounded_field_rejects_a_value_out_of_range_naming_field_range_and_value(cls, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be (>=|>|in) .*got {re.escape(repr(value))}"):
        build(cls, **{name: value})


@pytest.mark.parametrize("cls", list(CONFIGS))
def test_every_numeric_field_has_a_range_or_is_declared_unbounded(cls):
    hints = typing.get_type_hints(cls)
    numeric = {f.name for f in dataclasses.fields(cls) if base_type(hints[f.name]) in (int, float)
               or (typing.get_origin(base_type(hints[f.name])) is tuple and typing.get_args(base_type(hints[f.name]))[0] in (int, float))}
    assert numeric - set(OUT_OF_RANGE[cls]) - {name for c, name in UNBOUNDED if c is cls} == set()


def test_the_issue_examples_fail_with_one_clear_message():
    examples = {
        "epochs": ({"epochs": "2"}, "training config epochs must be an integer, got '2' (str)"),
        "d_model": ({"model": {"d_model": "64"}}, "model config d_model must be an integer, got '64' (str)"),
        "seed": ({"seed": 0.5}, "training config seed must be an integer, got 0.5 (float)"),
        "max_val_batches": ({"max_val_batches": 0}, "training config max_val_batches must be in [1, 1000000], got 0"),
    }
    for settings, message in examples.values():
        with pytest.raises(ValueError, match=re.escape(message)):
            TrainConfig.from_dict({"data": "data/demos", **settings})


def test_json_lists_become_tuples_and_objects_become_nested_configs():
    config = TrainConfig.from_dict(json.loads(json.dumps({
        "data": "d", "train_presets": ["default", "shift-1"], "augment": {"hue": 0.5},
        "model": {"encoder": {"channels": [8, 16, 16]}}, "udacity_augment": {"brightness": [0.9, 1.1]}})))
    assert config.train_presets == ("default", "shift-1") and config.augment == AugmentConfig(hue=0.5)
    assert config.model.encoder.channels == (8, 16, 16) and config.udacity_augment.brightness == (0.9, 1.1)
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_unknown_and_missing_fields_are_named():
    with pytest.raises(ValueError, match=r"training config augment: unknown fields \['hoo'\]; known fields are \['brightness'"):
        TrainConfig.from_dict({"data": "d", "augment": {"hoo": 1}})
    with pytest.raises(ValueError, match=r"training config: missing fields \['data'\]"):
        TrainConfig.from_dict({})
    with pytest.raises(ValueError, match="model config encoder must be an object of EncoderConfig fields or None, got 'cnn'"):
        ModelConfig.from_dict({"encoder": "cnn"})


def test_a_bad_device_and_cnn_channels_that_groupnorm_cannot_split_are_rejected():
    with pytest.raises(ValueError, match="training config device: expected auto or a torch device .* got 'gpu'"):
        TrainConfig(data="d", device="gpu")
    with pytest.raises(ValueError, match=r"multiples of 8 .* got \(8, 12, 16\)"):
        EncoderConfig(channels=(8, 12, 16))


@given(st.one_of(st.text(), st.floats(), st.booleans(), st.lists(st.integers(), max_size=3), st.none()),
       st.sampled_from(["sequence_length", "frame_stride", "batch_size", "epochs", "plateau_patience", "early_stopping_patience",
                        "cache_episodes", "seed"]))
def test_integer_fields_take_integers_only(value, name):
    with pytest.raises(ValueError, match=f"training config {name} must be an integer"):
        TrainConfig(data="d", **{name: value})


def test_range_reads_as_its_bounds():
    assert [str(r) for r in (Range(1), Range(0, low_open=True), Range(0, 1, high_open=True), Range(high=5))] == [
        ">= 1", "> 0", "in [0, 1)", "<= 5"]


def test_the_checker_refuses_ranges_for_fields_the_config_does_not_have():
    with pytest.raises(TypeError, match=r"ranges for unknown fields \['epoch'\]"):
        check_fields(AugmentConfig(), "augment", {"epoch": Range(1)})
    with pytest.raises(ValueError, match="augment must be an object of AugmentConfig fields"):
        config_from_dict(AugmentConfig, [1], "augment")


SHIPPED_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=[p.name for p in SHIPPED_CONFIGS])
def test_every_shipped_recipe_is_a_valid_training_config(path):
    settings = json.loads(path.read_text())
    config = TrainConfig.from_dict({"data": "data/any", **settings})
    model = settings.get("model", {})
    assert (config.model.model, config.epochs, config.lr) == (model.get("model", "nsac"), settings["epochs"], settings["lr"])
    for name, value in model.items():
        if not isinstance(value, dict):
            assert getattr(config.model, name) == value, name
