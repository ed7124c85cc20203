"""The settings an output folder's results were made with: recorded when a job starts, compared when it resumes.

A job (a recording, a closed-loop evaluation) names the fields of its frozen config dataclass
that shape its results. :func:`record_settings` writes them to ``FOLDER/.settings.json``
(atomically); :func:`check_settings` reads them back *through the dataclass* — the recorded
values, typed as the fields declare (a nested config's object rebuilt as that config), replace
the current ones in a copy of the config, fields recorded by an older version take their
defaults, so fields added later do not block a resume — and raises
:class:`SettingsChanged` naming every field whose value differs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.common.config_checks import field_from_json

SETTINGS_FILE = ".settings.json"  # hidden: dataset readers never take it for an episode sidecar


@dataclass(frozen=True)
class SettingChange:
    """One setting whose recorded value differs from the value a resumed job asks for (``name``:
    a field, or ``field.subfield`` inside a nested config)."""

    name: str
    recorded: Any
    requested: Any


class SettingsChanged(ValueError):
    """A job resumed with settings other than the ones its folder was made with."""

    def __init__(self, path: Path, changes: Sequence[SettingChange]) -> None:
        self.path = path
        self.changes = tuple(changes)
        super().__init__(self.describe())

    def describe(self, flags: Mapping[str, str] | None = None, folder: str = "output folder") -> str:
        """The refusal in the library's terms (``steps 10 recorded, 20 now``) or, given ``flags``, in a
        command line's (``--max-steps 10 there, 20 now``: values as typed, None as ``unset``).

        :param flags: the command-line flag of each changed setting (``field`` or ``field.subfield``);
            a setting without one keeps its own name
        :param folder: what the advice at the end calls the output folder, e.g. ``--out``
        """
        if flags is None:
            listed = [f"{c.name} {c.recorded!r} recorded, {c.requested!r} now" for c in self.changes]
        else:
            listed = [f"{flags.get(c.name, c.name)} {_as_typed(c.recorded)} there, {_as_typed(c.requested)} now"
                      for c in self.changes]
        return (f"{self.path.parent} holds results made with other settings ({'; '.join(listed)}); "
                f"use the recorded settings or another {folder}")


def _as_typed(value: Any) -> str:
    """A setting's JSON value as a command line types it: a list comma-separated, None as ``unset``."""
    if value is None:
        return "unset"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def plain(value: Any) -> Any:
    """A field value as JSON stores it (nested dataclasses as dicts, tuples as lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value))


def settings_of(config: Any, fields: Sequence[str]) -> dict[str, Any]:
    """The named fields of the dataclass instance ``config``, JSON-ready."""
    return {name: plain(getattr(config, name)) for name in fields}


def record_settings(folder: Path, config: Any, fields: Sequence[str]) -> None:
    """Write the named fields of ``config`` to ``folder/.settings.json`` (atomically)."""
    atomic_write_json(Path(folder) / SETTINGS_FILE, settings_of(config, fields))


def differences(name: str, recorded: Any, requested: Any) -> list[SettingChange]:
    """The leaves that differ; nested configs (dicts on both sides) are compared field by field."""
    if isinstance(recorded, dict) and isinstance(requested, dict):
        return [change for key in sorted(recorded.keys() | requested.keys())
                for change in differences(f"{name}.{key}", recorded.get(key), requested.get(key))]
    return [] if recorded == requested else [SettingChange(name, recorded, requested)]


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise KeyError(field.name)


def check_settings(folder: Path, config: Any, fields: Sequence[str]) -> None:
    """Raise :class:`SettingsChanged` if ``folder`` records other values for the named fields of
    ``config`` (a folder without a record passes: nothing to compare with).

    A field missing from the record compares at its default (the record predates the field);
    recorded fields the config no longer has are ignored. An unreadable record is a ValueError
    naming the file.
    """
    path = Path(folder) / SETTINGS_FILE
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
        declared = {f.name: f for f in dataclasses.fields(config)}
        values = {name: field_from_json(type(config), name, recorded[name], name) if name in recorded
                  else _default(declared[name]) for name in fields}
        as_recorded = dataclasses.replace(config, **values)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable settings record ({type(exc).__name__}: {exc})") from None
    before, now = settings_of(as_recorded, fields), settings_of(config, fields)
    changes = [change for name in fields for change in differences(name, before[name], now[name])]
    if changes:
        raise SettingsChanged(path, changes)
