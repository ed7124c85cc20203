"""The docs' reference pages, generated from the code so they cannot drift from it:

    python -m bench.reference render   # docs/reference/cli.md (every command, its options and defaults)
                                       # docs/reference/configs.md (every config dataclass: fields, types, defaults, ranges)
    python -m bench.reference check    # exit 1, naming each page, when a page differs from what the code gives

The command pages come from the Typer app itself (its click commands), the config pages from the
frozen dataclasses and the ranges their checks use, so a new option or field appears here the
moment it exists, and ``check`` (part of ``make test``) fails until the pages are rendered again.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from bench.results import render_table
from nsacdrive.common.atomic import atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]
GENERATED = "<!-- generated from the code by `make reference`: do not edit -->"


def _configs() -> list[tuple[type, dict[str, Any]]]:
    """The config dataclasses a user sets, each with the ranges its checks apply (field → Range)."""
    from nsacdrive.agents.ppo_config import PPO_RANGES, PPOConfig
    from nsacdrive.controllers import model_config, train_config
    from nsacdrive.controllers.augment import AUGMENT_RANGES, AugmentConfig
    from nsacdrive.controllers.encoders import ENCODER_RANGES, EncoderConfig
    from nsacdrive.controllers.robust_augment import ROBUST_AUGMENT_RANGES, RobustAugmentConfig
    from nsacdrive.controllers.udacity_augment import UDACITY_AUGMENT_RANGES, UdacityAugmentConfig
    from nsacdrive.data_collection.recorder import COLLECT_RANGES, NOISE_RANGES, CollectConfig, NoiseConfig
    from nsacdrive.data_collection.udacity_import import IMPORT_RANGES, ImportConfig
    from nsacdrive.eval.configs import (
        DAGGER_RANGES,
        DRIVE_RANGES,
        EVAL_RANGES,
        MONITOR_RANGES,
        DaggerConfig,
        DriveConfig,
        EvalConfig,
        MonitorConfig,
    )

    return [(train_config.TrainConfig, train_config.RANGES), (model_config.ModelConfig, model_config.RANGES),
            (EncoderConfig, ENCODER_RANGES), (AugmentConfig, AUGMENT_RANGES), (UdacityAugmentConfig, UDACITY_AUGMENT_RANGES),
            (RobustAugmentConfig, ROBUST_AUGMENT_RANGES), (CollectConfig, COLLECT_RANGES), (NoiseConfig, NOISE_RANGES),
            (DriveConfig, DRIVE_RANGES), (EvalConfig, EVAL_RANGES), (MonitorConfig, MONITOR_RANGES), (DaggerConfig, DAGGER_RANGES),
            (ImportConfig, IMPORT_RANGES), (PPOConfig, PPO_RANGES)]


def _type_name(annotation: Any) -> str:
    """An annotation as a reader writes it: ``int | None``, ``tuple[str, ...]``, ``EncoderConfig``."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return f"{type(value).__name__}()"
    return f"`{value!r}`"


def config_page() -> str:
    """Markdown of every config dataclass: one table of fields per class, with its docstring's first line."""
    parts = [GENERATED, "", "# Config fields", "",
             "Every setting a run, a recording or an evaluation is made with, as the frozen dataclasses define "
             "it: a config file (`--config`) holds these fields, and each result folder saves them beside its "
             "results. Ranges are the ones the classes check on construction; floats must be finite; a field "
             "without a range here is checked by its class's own rules, and a bad value is refused with a message "
             "naming the field and what it expects.", ""]
    for cls, ranges in _configs():
        hints = typing.get_type_hints(cls)
        summary = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        rows = [[f"`{f.name}`", _cell(f"`{_type_name(hints[f.name])}`"), _cell(_default(f)), str(ranges[f.name]) if f.name in ranges else ""]
                for f in dataclasses.fields(cls)]
        parts += [f"## {cls.__name__}", "", f"`{cls.__module__}.{cls.__name__}`: {summary}", "",
                  render_table(["field", "type", "default", "range"], rows), ""]
    return "\n".join(parts)


# Typer carries its own copy of click, so commands and parameters are recognised by what they have.

def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(full name, command) of every command below the click group ``group``, in the order ``--help`` lists them."""
    context = group.context_class(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        if hasattr(command, "list_commands"):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def _param_row(param: Any, context: Any) -> list[str]:
    """[option or argument with its metavar, its help with the default] as ``--help`` prints them."""
    record = param.get_help_record(context)
    name, text = record if record is not None else (param.name.upper(), getattr(param, "help", None) or "")
    return [_cell(f"`{name}`"), _cell(text)]


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (a ``|`` ends a cell, even inside code)."""
    return text.replace("|", "\\|").replace("\n", " ")


def cli_page() -> str:
    """Markdown of every ``nsacdrive`` command: its help and a table of its arguments and options."""
    from nsacdrive.cli import app

    root = typer.main.get_command(app)
    parts = [GENERATED, "", "# Command line", "",
             "Every `nsacdrive` command with its arguments and options, as `--help` gives them. Each guide "
             "page explains a command group; this page is the complete list.", ""]
    for name, command in _commands(root, "nsacdrive"):
        context = command.context_class(command, info_name=name)
        rows = [_param_row(p, context) for p in command.params if not getattr(p, "hidden", False) and p.name != "help"]
        parts += [f"## `{name}`", "", (command.help or "").strip(), ""]
        if rows:
            parts += [render_table(["argument / option", "what it does (default)"], rows), ""]
    return "\n".join(parts)


PAGES = {"docs/reference/cli.md": cli_page, "docs/reference/configs.md": config_page}


def render(root: Path = REPO) -> list[Path]:
    """Write every reference page (atomically); returns their paths."""
    written = []
    for relative, page in PAGES.items():
        atomic_write_bytes(root / relative, (page() + "\n").encode())
        written.append(root / relative)
    return written


def check(root: Path = REPO) -> list[str]:
    """One message per reference page that differs from what the code gives (none: all current)."""
    problems = []
    for relative, page in PAGES.items():
        path = root / relative
        if not path.is_file() or path.read_text() != page() + "\n":
            problems.append(f"{relative} differs from what the code gives: run `make reference`")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("render", "check"))
    args = parser.parse_args(argv)
    if args.action == "render":
        for path in render():
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
