"""Choices of the command line, built from the library's own registries (one source of truth)."""

from __future__ import annotations

import enum
from collections.abc import Iterable


def choice(name: str, values: Iterable[str]) -> type[enum.Enum]:
    """A str-valued Enum over a registry's names: typer lists them in ``--help`` and rejects any
    other value with exit code 2 and a message naming the valid ones."""
    return enum.Enum(name, {value: value for value in values}, type=str)  # type: ignore[return-value]


def split_names(text: str) -> list[str]:
    """``"default, shift-3,"`` → ``["default", "shift-3"]``: the items of a comma-separated option."""
    return [name.strip() for name in text.split(",") if name.strip()]
