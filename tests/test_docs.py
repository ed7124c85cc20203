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
