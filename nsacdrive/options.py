"""Choices of the command line, built from the library's own registries (one source of truth)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any, TypeVar

import typer

T = TypeVar("T")


def choice(name: str, values: Iterable[str]) -> type[enum.Enum]:
    """A str-valued Enum over a registry's names: typer lists them in ``--help`` and rejects any
    other value with exit code 2 and a message naming the valid ones."""
    return enum.Enum(name, {value: value for value in values}, type=str)  # type: ignore[return-value]


def split_names(text: str) -> list[str]:
    """``"default, shift-3,"`` → ``["default", "shift-3"]``: the items of a comma-separated option."""
    return [name.strip() for name in text.split(",") if name.strip()]


def old_spelling(flag: str, **checks: Any) -> Any:
    """A hidden option under a renamed flag's old spelling, kept for one release: None unless given
    (``checks``: the new flag's bounds, e.g. ``min=1``); :func:`renamed` reads it."""
    return typer.Option(None, flag, hidden=True, **checks)


def renamed(old: str, new: str, given: T | None, value: T) -> T:
    """The value of option ``new``, or, when its old spelling ``old`` was given, that one's, with a
    warning on stderr that names the new spelling."""
    if given is None:
        return value
    typer.secho(f"warning: {old} is deprecated, use {new}", fg="yellow", err=True)
    return given


def config_default(config: type, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``config``: an option's default read from the
    config that owns it, so ``--help`` and the config cannot disagree."""
    field = next(f for f in dataclasses.fields(config) if f.name == name)
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def seed_list(text: str, flag: str = "--seeds", hint: bool = False) -> list[int]:
    """Seeds of a command-line option (:func:`nsacdrive.common.seeds.parse_seeds`), a bad list refused
    as a usage error (with ``hint``, one that names ``flag``)."""
    from nsacdrive.common.seeds import parse_seeds

    try:
        return parse_seeds(text, flag)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag if hint else None) from None
