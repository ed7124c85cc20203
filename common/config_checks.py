"""Type and range checks for frozen config dataclasses, driven by their field annotations.

A config's ``__post_init__`` calls :func:`check_fields` once instead of one ``if`` per field:
every field must have its annotated type (``int``, ``float``, ``bool``, ``str``, ``X | None``,
``Literal[...]``, ``tuple[...]``, a nested config class) and, where a :class:`Range` is given,
lie in it. A bool is not a number here (``True`` is no epoch count), an int is a float, floats
must be finite; what JSON gives is converted first: a list for a tuple field becomes a tuple, an
object for a nested config becomes that config (:func:`config_from_dict`, unknown keys rejected;
:func:`field_from_json` does the same for one field, for code that rebuilds a config from JSON).
A config whose callers pass other types (paths, lists) checks only its ranges, :func:`check_ranges`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Config = TypeVar("Config")


@dataclass(frozen=True)
class Range:
    """The numbers a field (or each element of a tuple field) may take; ``None`` leaves a side open.

    :param low: smallest allowed value
    :param high: largest allowed value
    :param low_open: exclude ``low`` itself
    :param high_open: exclude ``high`` itself
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


AT_LEAST_ONE = Range(1)
#: a count of epochs, batches, samples or frames: at least one, and far below what a loop, a slice or memory could take
COUNT = Range(1, 1_000_000)
#: a network's width (channels, features, heads, members, draws, depth): a run folder's config from
#: someone else must not make a model that cannot fit in memory before its weights are checked
WIDTH = Range(1, 4096)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
UNIT_INTERVAL = Range(0, 1)


def check_fields(config: Any, where: str, ranges: Mapping[str, Range] | None = None) -> None:
    """Raise ValueError naming ``where``, the field, what was expected and the value given, unless
    every field of the dataclass instance ``config`` matches its annotation and its range.

    :param config: a dataclass instance (frozen is fine: list-to-tuple fixes are set in place)
    :param where: what the config is called in messages (``"training config"`` → "training config epochs must be …")
    :param ranges: field name → allowed numbers (every key must be a field of ``config``)
    """
    ranges = dict(ranges or {})
    names = {f.name for f in dataclasses.fields(config)}
    if not set(ranges) <= names:
        raise TypeError(f"{type(config).__name__}: ranges for unknown fields {sorted(set(ranges) - names)}")
    for name, annotation in _annotations(type(config)).items():
        given = getattr(config, name)
        value = _from_json(given, annotation, f"{where} {name}")
        if value is not given:
            object.__setattr__(config, name, value)
        if not _matches(value, annotation):
            raise ValueError(f"{where} {name} must be {_describe(annotation)}, got {given!r} ({type(given).__name__})")
        bounds = ranges.get(name)
        if bounds is not None and not all(bounds.contains(number) for number in _numbers(value)):
            raise ValueError(f"{where} {name} must be {bounds}, got {given!r}")


def check_ranges(config: Any, where: str, ranges: Mapping[str, Range]) -> None:
    """Raise ValueError naming ``where``, the field, its range and the value given, unless every
    number of each field in ``ranges`` lies in its range (a tuple's elements each; None is exempt).

    For configs whose fields :func:`check_fields` cannot type-check strictly (a ``Path`` for a
    string, a list for a tuple a caller converts itself): only the ranges are checked, so one dict
    gives both the checks and the reference page's ranges. A field that may be None says so in the
    message ("must be >= 0 or None").

    :param config: a dataclass instance
    :param where: what the config is called in messages (``"drive config"`` → "drive config max_steps must be …")
    :param ranges: field name → allowed numbers (every key must be a field of ``config``)
    """
    annotations = _annotations(type(config))
    if not set(ranges) <= set(annotations):
        raise TypeError(f"{type(config).__name__}: ranges for unknown fields {sorted(set(ranges) - set(annotations))}")
    for name, bounds in ranges.items():
        value = getattr(config, name)
        optional = type(None) in _alternatives(annotations[name])
        if value is None and optional:
            continue
        items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        found = _numbers(items)
        if len(found) != len(items) or not all(bounds.contains(number) for number in found):  # a non-number is in no range
            raise ValueError(f"{where} {name} must be {bounds}{' or None' if optional else ''}, got {value!r}")


def config_from_dict(cls: type[Config], data: Any, where: str) -> Config:
    """``cls(**data)`` for a JSON object ``data``; a non-object, unknown keys or missing required
    fields raise ValueError naming ``where`` and the fields (instead of a TypeError)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be {_describe(cls)}, got {data!r} ({type(data).__name__})")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    known = {f.name for f in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; known fields are {sorted(known)}")
    no_default = dataclasses.MISSING
    missing = [f.name for f in fields if f.default is no_default and f.default_factory is no_default and f.name not in data]
    if missing:
        raise ValueError(f"{where}: missing fields {missing}")
    return cls(**data)


def field_from_json(cls: type, name: str, value: Any, where: str) -> Any:
    """``value``, as JSON gives it for field ``name`` of the config class ``cls``, converted to the
    field's annotation like :func:`check_fields` does (an object for a nested config → that config
    via :func:`config_from_dict`, a list for a tuple → a tuple); other values are returned as given.
    Bad nested objects raise ValueError naming ``where``."""
    return _from_json(value, _annotations(cls)[name], where)


def _from_json(value: Any, annotation: Any, where: str) -> Any:
    """A list given for a tuple field → tuple; an object given for a nested config → that config."""
    for option in _alternatives(annotation):
        if isinstance(value, list) and typing.get_origin(option) is tuple:
            return tuple(value)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(option):
            return config_from_dict(option, value, where)
    return value


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if _is_union(annotation) else (annotation,)


def _matches(value: Any, annotation: Any) -> bool:
    if _is_union(annotation):
        return any(_matches(value, option) for option in typing.get_args(annotation))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return any(type(value) is type(option) and value == option for option in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(item, args[0]) for item in value)
        return len(value) == len(args) and all(_matches(item, arg) for item, arg in zip(value, args, strict=True))
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    if _is_union(annotation):
        return " or ".join(_describe(option) for option in typing.get_args(annotation))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(option) for option in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return f"a list of {len(args)} {_plural(args[0])}" if len(set(args)) == 1 else f"a list ({', '.join(map(_describe, args))})"
    if dataclasses.is_dataclass(annotation):
        return f"an object of {annotation.__name__} fields"
    names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", type(None): "None"}
    return names.get(annotation, f"a {getattr(annotation, '__name__', annotation)}")


def _plural(annotation: Any) -> str:
    names = {int: "integers", float: "finite numbers", bool: "booleans", str: "strings"}
    return names.get(annotation, _describe(annotation))


def _numbers(value: Any) -> list[float]:
    """The numbers a range applies to: the value itself, or a tuple's elements; None is exempt."""
    items = value if isinstance(value, tuple) else (value,)
    return [item for item in items if isinstance(item, numbers.Real) and not isinstance(item, bool)]


def check_distinct(where: str, name: str, values: Sequence[Any]) -> None:
    """Raise ValueError naming ``where``, the field and every value ``values`` lists more than once."""
    repeated = sorted(str(value) for value, count in Counter(values).items() if count > 1)
    if repeated:
        raise ValueError(f"{where} {name}: listed twice: {', '.join(repeated)}")
