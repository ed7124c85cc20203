"""The README and the user-facing docs: short, free of provenance, and their Python example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the user's pages: provenance (dates, machines, issue numbers) lives with the results, not here
USER_PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md")),
              *sorted((ROOT / "docs" / "getting-started").glob("*.md")), *sorted((ROOT / "docs" / "extending").glob("*.md"))]
PROVENANCE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bissues? \d+|\b(Xeon|EPYC|Zen ?4|Intel machine|AMD machine)\b", re.IGNORECASE)


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert "<!-- results:headline:start -->" in lines and "<!-- results:headline:end -->" in lines


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_hold_no_dates_machines_or_issue_numbers(page):
    found = [f"line {n}: {m.group(0)!r}" for n, line in enumerate(page.read_text().splitlines(), 1)
             for m in PROVENANCE.finditer(line)]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_the_readme_python_example_drives_a_run_and_reads_its_uncertainty(tmp_path, capsys):
    from run_fixtures import tiny_run

    example = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    run = tiny_run(tmp_path)
    assert '"runs/demo-dagger/runs/round-1"' in example and "range(1000)" in example
    code = example.replace('"runs/demo-dagger/runs/round-1"', repr(str(run))).replace("range(1000)", "range(101)")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["0", "100"]
    assert all(line.count("[") == 3 for line in printed)  # the action and both variances


def test_the_reference_pages_are_what_the_code_gives():
    from bench.reference import check

    assert check() == []


#: the fields each config on the reference page needs to be built (the others have defaults)
REQUIRED_FIELDS: dict[str, dict[str, object]] = {"TrainConfig": {"data": "data/demos"}, "CollectConfig": {"agent": "expert", "seeds": (0,)},
                                                 "EvalConfig": {"runs": ("run",), "seeds": (1,)}, "DaggerConfig": {"init": "run"}}
#: what a config's messages call a field where that is the command's option rather than the field's name
MESSAGE_NAMES = {("NoiseConfig", "sigma"): "--noise", ("NoiseConfig", "seed"): "--noise-seed",
                 ("ImportConfig", "episode_length"): "--episode-length", ("ImportConfig", "first_seed"): "--seed"}


def _outside_values():
    """(class, field, a value just outside the field's range) for every bounded field on the configs page."""
    import dataclasses
    import types
    import typing

    from bench.reference import _configs

    for cls, ranges in _configs():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            bounds = ranges.get(field.name)
            if bounds is None:
                continue
            outside = []
            if bounds.low is not None:
                outside.append(bounds.low if bounds.low_open else bounds.low - 1)
            if bounds.high is not None:
                outside.append(bounds.high if bounds.high_open else bounds.high + 1)
            annotation = hints[field.name]
            union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
            is_tuple = any(typing.get_origin(option) is tuple for option in (typing.get_args(annotation) if union else (annotation,)))
            for value in outside:
                yield pytest.param(cls, field.name, (value,) if is_tuple else value, id=f"{cls.__name__}.{field.name}={value}")


@pytest.mark.parametrize(("cls", "name", "value"), list(_outside_values()))
def test_every_range_on_the_configs_page_is_one_its_config_refuses_to_leave(cls, name, value):
    """The page's ranges are the ones the classes check: a value just outside one is refused, naming the field."""
    label = MESSAGE_NAMES.get((cls.__name__, name), name)
    with pytest.raises(ValueError, match=re.escape(f"{label} must be ")):
        cls(**REQUIRED_FIELDS.get(cls.__name__, {}), **{name: value})


def test_every_config_on_the_configs_page_can_be_built_from_its_required_fields():
    from bench.reference import _configs

    for cls, _ in _configs():
        cls(**REQUIRED_FIELDS.get(cls.__name__, {}))
