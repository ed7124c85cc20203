"""bench/results.py: the committed results render to what is committed, and any edit to a figure,
a missing provenance key or a changed recipe shows up, naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import results
from bench.results import HEADLINE_END, HEADLINE_START, Layout, recorded_arguments

REPO = Path(__file__).resolve().parent.parent
STUDIES = sorted((REPO / "results").glob("*.json"))


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """A copy of the repository's results, configs, generated pages and README under tmp_path."""
    for folder in ("results", "configs", "docs/results"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    return Layout.of(tmp_path)


def test_the_committed_files_are_what_the_json_gives():
    assert STUDIES, "no results/*.json"
    assert results.check(Layout.of(REPO)) == []


def test_render_then_check_passes(layout: Layout):
    shutil.rmtree(layout.docs)
    assert results.render(layout) == []
    assert results.check(layout) == []
    assert results.main(["check", "--root", str(layout.root)]) == 0


def _leaves(value, path=()):
    """(path, value) of every string or number in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from _leaves(item, (*path, k))
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield path, value


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _bumped(value):
    """``value`` with its first digit changed (a number changed by one)."""
    if isinstance(value, (int, float)):
        return value + 1
    match = re.search(r"\d", value)
    return value[:match.start()] + str((int(match.group()) + 1) % 10) + value[match.end():]


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_number_of_a_study_reaches_its_page(path: Path):
    data = json.loads(path.read_text())
    layout = Layout.of(REPO)
    page = results.render_study(data, layout)
    for where, value in _leaves(data):
        if where == ("study",) or (isinstance(value, str) and not re.search(r"\d", value)):
            continue
        changed = json.loads(path.read_text())
        _set(changed, where, _bumped(value))
        assert results.render_study(changed, layout) != page, f"{path.name}: {where} does not reach the page"


def test_a_changed_figure_fails_the_check_naming_the_file(layout: Layout):
    path = layout.results / "quality-recipe.json"
    data = json.loads(path.read_text())
    row = data["tables"][0]["rows"][0]
    column = next(k for k, cell in enumerate(row) if re.search(r"\d", str(cell)))  # a figure, not a label
    row[column] = _bumped(row[column])
    path.write_text(json.dumps(data))
    problems = results.check(layout)
    assert "docs/results/quality-recipe.md differs from what results/quality-recipe.json gives: run `make results`" in problems
    assert results.main(["check", "--root", str(layout.root)]) == 1


def test_a_hand_edited_page_fails_the_check(layout: Layout):
    page = layout.docs / "demo-recipe.md"
    page.write_text(page.read_text().replace("100 ± 0 %", "99 ± 0 %", 1))
    assert results.check(layout) == ["docs/results/demo-recipe.md differs from what results/demo-recipe.json gives: "
                                     "run `make results`"]


@pytest.mark.parametrize("key", results.PROVENANCE_KEYS)
def test_a_missing_provenance_key_fails_naming_it(layout: Layout, key: str):
    path = layout.results / "benchmarks.json"
    data = json.loads(path.read_text())
    del data["provenance"][key]
    path.write_text(json.dumps(data))
    assert f"results/benchmarks.json: provenance lacks {key!r}" in results.check(layout)


def test_a_missing_machine_field_and_malformed_json_fail_naming_the_file(layout: Layout):
    data = json.loads((layout.results / "front-camera.json").read_text())
    del data["provenance"]["machine"]["gpu"]
    (layout.results / "front-camera.json").write_text(json.dumps(data))
    (layout.results / "broken.json").write_text("{")
    problems = results.check(layout)
    assert "results/front-camera.json: provenance 'machine' lacks 'gpu'" in problems
    assert any(p.startswith("results/broken.json: not readable JSON") for p in problems)


def test_a_changed_config_renders_the_stale_warning_with_its_commands(layout: Layout):
    fresh = [(path, json.loads(path.read_text())) for path in sorted(layout.results.glob("*.json"))]
    path, data = next((path, data) for path, data in fresh
                      if data["provenance"]["config_sha256"] and "Stale" not in results.render_study(data, layout))
    name = sorted(data["provenance"]["config_sha256"])[0]
    config = layout.root / name
    config.write_text(config.read_text() + "\n")
    page = results.render_study(data, layout)
    assert f"> **Stale:** `{name}` changed since these figures were made" in page
    for command in data["provenance"]["command"]:
        assert f">     {command}" in page
    assert f"docs/results/{path.stem}.md differs from what results/{path.name} gives: run `make results`" in results.check(layout)


def test_the_readme_markers_are_required_and_nothing_else_is_touched(layout: Layout):
    readme = layout.readme.read_text()
    layout.readme.write_text(readme.replace(HEADLINE_START + "\n", ""))
    problems = results.render(layout)
    assert any(p.startswith("README.md: needs the marker lines") for p in problems)
    assert results.check(layout)
    text = "intro\n" + HEADLINE_START + "\nold table\n" + HEADLINE_END + "\noutro\n"
    layout.readme.write_text(text)
    assert results.render(layout) == []
    rendered = layout.readme.read_text()
    assert rendered.startswith("intro\n" + HEADLINE_START + "\n") and rendered.endswith(HEADLINE_END + "\noutro\n")
    assert "old table" not in rendered and "docs/results/quality-recipe.md" in rendered


def test_dates_machines_and_commits_stay_inside_provenance_blocks(layout: Layout):
    files, problems = results.rendered(layout)
    assert problems == []
    machines = {p["machine"][key] for s in STUDIES for p in _provenances(json.loads(s.read_text()))
                for key in ("cpu", "gpu")} - {None}  # a machine the README does not name is null
    headline = files[layout.readme].split(HEADLINE_START)[1].split(HEADLINE_END)[0]
    for path, text in files.items():
        outside = headline if path == layout.readme else re.sub(
            re.escape(results.PROVENANCE_START) + ".*?" + re.escape(results.PROVENANCE_END), "", text, flags=re.S)
        assert not results.PROVENANCE_ONLY.search(outside), path
        assert not any(machine in outside for machine in machines), path


def _provenances(study: dict) -> list[dict]:
    return [study["provenance"], *(t["provenance"] for t in study["tables"] if "provenance" in t)]


def test_a_date_in_a_table_is_refused(layout: Layout):
    data = json.loads((layout.results / "demo-recipe.json").read_text())
    data["tables"][0]["caption"] = "run on 2026-01-02"
    with pytest.raises(results.ResultsError, match="demo-recipe.json: table 'Laps per training seed' holds '2026-01-02'"):
        results.validate_study(data, "demo-recipe", "results/demo-recipe.json")


def test_write_results_fills_provenance_from_this_machine(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.json").write_text("{}")
    provenance = results.current_provenance(["python -m bench.x"], ["configs/x.json"], [0, 1], root=tmp_path)
    assert provenance["config_sha256"] == {"configs/x.json": results.file_sha256(tmp_path / "configs" / "x.json")}
    assert provenance["commit"] is None and provenance["dirty"] is None  # not a git checkout
    assert provenance["machine"]["cores"] and set(provenance["versions"]) == set(results.VERSION_KEYS)
    table = {"name": "t", "caption": "", "columns": ["a", "b"], "rows": [["x", 1.5]]}
    path = results.write_results("x", "X", [table], provenance, root=tmp_path)
    assert results.load_study(path, Layout.of(tmp_path))["tables"] == [table]
    with pytest.raises(results.ResultsError, match="configs/missing.json: config not found"):
        results.current_provenance(["c"], ["configs/missing.json"], [], root=tmp_path)


def test_put_table_adds_or_replaces_one_table_with_its_own_provenance(layout: Layout):
    provenance = results.current_provenance(["python -m bench.safety_cost --results"], [], [], root=layout.root)
    table = {"name": "A table of the test", "caption": "", "columns": ["side", "seconds, ratio"],
             "rows": [["controller alone", "1.00 s, ×1.000"]], "provenance": provenance}
    before = results.load_study(layout.results / "benchmarks.json", layout)["tables"]
    results.put_table("benchmarks", table, root=layout.root)
    results.put_table("benchmarks", {**table, "rows": [["controller alone", "2.00 s, ×1.000"]]}, root=layout.root)
    after = results.load_study(layout.results / "benchmarks.json", layout)["tables"]
    assert after[:-1] == before and after[-1]["rows"] == [["controller alone", "2.00 s, ×1.000"]]
    with pytest.raises(results.ResultsError):
        results.put_table("benchmarks", {**table, "rows": [["run on 2026-01-01", 1]]}, root=layout.root)


def test_recorded_arguments_drop_how_the_figures_were_read() -> None:
    argv = ["runs/a", "--written", "--made-with", "nsacdrive train x", "--seeds", "0,1"]
    assert recorded_arguments(argv, options=("--made-with",)) == ["runs/a", "--seeds", "0,1"]
    assert recorded_arguments(argv) == ["runs/a", "--made-with", "nsacdrive train x", "--seeds", "0,1"]


def test_a_headline_row_is_found_by_its_first_cell_or_its_leading_cells():
    from bench.results import HeadlineRow

    by_first = HeadlineRow("label", "study", "table", "runs/a", ("laps",))
    by_leading = HeadlineRow("label", "study", "table", ("runs/a", "shift-3"), ("laps",))
    assert by_first.matches(["runs/a", "default", "11"]) and not by_first.matches(["runs/b", "default", "11"])
    assert by_leading.matches(["runs/a", "shift-3", "10"]) and not by_leading.matches(["runs/a", "default", "11"])


def test_a_bare_pipe_stays_inside_its_cell():
    table = results.render_table(["score", "|lat|"], [["a|b", "\\|c\\|"]])
    assert table.splitlines() == ["| score | \\|lat\\| |", "|---|---|", "| a\\|b | \\|c\\| |"]
