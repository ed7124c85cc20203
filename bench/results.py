"""Results that regenerate from saved files: every study the docs report keeps its figures in one
small JSON file, ``results/<study>.json``, and every table the docs show is rendered from those files.

    python -m bench.results render   # docs/results/<study>.md, docs/results/index.md, the README's headline table
    python -m bench.results check    # exit 1, naming each file, when a rendered file differs from what the JSON gives

``check`` renders into memory and compares, so no generated table can be edited by hand: change the
JSON (or re-run the study, which rewrites it through :func:`write_results`) and run ``render``.

Schema of ``results/<study>.json`` (unknown keys are refused, so every value in a file is rendered)::

    {
      "study": "quality-recipe",            # the file's stem
      "title": "The quality recipe across training seeds",
      "provenance": PROVENANCE,             # of the study's runs; a table may carry its own
      "tables": [
        {"name": "…",                       # the table's heading, unique in the file
         "caption": "…",                    # what the rows are (Markdown; may be "")
         "columns": ["run", "default", …],
         "rows": [["BC", "100 / 100 / 100", …], …],  # per-seed rows, then mean ± spread rows where reported
         "provenance": PROVENANCE}          # optional: this table's runs differ from the study's
      ]
    }

    PROVENANCE = {
      "command": ["nsacdrive sweep …", …],  # every command, exactly as run
      "commit": "<40 hex>" | null,          # git HEAD of the checkout that ran them
      "dirty": true | false | null,         # uncommitted changes in that checkout
      "date": "2026-01-31T12:00:00+00:00" | "2026-01-31" | null,
      "machine": {"cpu": "…" | null, "cores": 2 | null, "gpu": "…" | null},
      "versions": {"python": …, "torch": …, "numpy": …, "gymnasium": …},  # strings or null
      "config_sha256": {"configs/quality.json": "<64 hex>", …},  # the recipe as run; the stale check
      "seeds": [0, 1, 2],                   # training seeds (or other seeds the study names)
      "recovered": false | "from the README's history",  # only for figures carried over from prose
      "note": "…"                           # where such figures came from; required with "recovered"
    }

A cell is Markdown text, kept exactly as reported (so "0.0140" and "91 ± 16" survive), a JSON
number (rendered as Python prints it) or null (rendered "–"). Cells, captions, names and columns
hold no dates or commit hashes: those live in provenance. Timings are tables, one per machine,
each with its own provenance naming that machine.

A table is *stale* when a config it names has changed since (its sha256 differs from today's file
under the repository root, or the file is gone): its page shows a warning with the commands that
refresh it, and the headline marks its figures.

The README's headline table (between ``<!-- results:headline:start -->`` and
``<!-- results:headline:end -->``; nothing outside them is touched) holds the figures of
:data:`HEADLINE`: closed-loop laps of the quality recipe on the test stage, clean and shifted; of
its NSAC (without and with pedal caution) and of the demo recipe across training seeds; the Lévy
quality recipe over five seeds, the front camera with pedal caution, the eight-model comparison's
clean steering CRPS of NSAC and of the best model, the misbehaviour monitor's F3 and the density
fallback's prevented failures, and the safety protocol's leave-one-family-out F3 and its `stop`
fallback. Each row links to its study's page, where the provenance is; the headline itself holds none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nsacdrive.common.atomic import atomic_write_bytes, atomic_write_json
from nsacdrive.common.versions import current_versions

REPO = Path(__file__).resolve().parent.parent
GENERATED = "<!-- generated from {source} by `make results`: do not edit; change the JSON and run `make results` -->"
PROVENANCE_START, PROVENANCE_END = "<!-- provenance:start -->", "<!-- provenance:end -->"
#: a ``|`` not already escaped, which would end a Markdown table's cell
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
HEADLINE_START, HEADLINE_END = "<!-- results:headline:start -->", "<!-- results:headline:end -->"
PROVENANCE_KEYS = ("command", "commit", "dirty", "date", "machine", "versions", "config_sha256", "seeds")
MACHINE_KEYS = ("cpu", "cores", "gpu")
VERSION_KEYS = ("python", "torch", "numpy", "gymnasium")
STUDY_KEYS = {"study", "title", "provenance", "tables"}
TABLE_KEYS = {"name", "caption", "columns", "rows", "provenance"}
OPTIONAL_PROVENANCE_KEYS = {"recovered", "note"}
#: text that belongs in a provenance block only: dates and commit-like hex strings
PROVENANCE_ONLY = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b")


@dataclass(frozen=True)
class HeadlineRow:
    """One headline row: the cells of ``columns`` in the row of ``table`` whose first cell is ``row``
    (a tuple: whose leading cells are these, for tables whose first column repeats)."""

    label: str
    study: str
    table: str
    row: str | tuple[str, ...]
    columns: tuple[str, ...]

    def matches(self, cells: list[Any]) -> bool:
        key = (self.row,) if isinstance(self.row, str) else self.row
        return tuple(cells[:len(key)]) == key


ENSEMBLE_TEST = "Laps, test stage, training seeds 0, 1, 2: quality (ensemble)"
HEADLINE = (
    *(HeadlineRow(f"Quality recipe (deep ensemble of four), tracks 42 and 1000–1009, {condition}", "robust-test", ENSEMBLE_TEST,
                  condition, ("quality, ensemble",)) for condition in ("clean", "shift-3", "random")),
    HeadlineRow("… under every shift of the test stage (colour presets and test families), laps pooled per seed", "robust-test", ENSEMBLE_TEST,
                "**shifted, pooled: laps per seed (mean ± std)**", ("quality, ensemble",)),
    HeadlineRow("Quality recipe's NSAC (`--model nsac`), laps per seed 0 / 1 / 2", "quality-recipe", "Hinge recipe, with and without pedal caution",
                "BC, the same config with `early_stopping_patience` 30 (seed 0 re-trained, all 30 epochs; seeds 1 and 2 are "
                "the runs above)", ("default", "shift-3", "random", "color-v0")),
    HeadlineRow("… the same NSAC with pedal caution 0.5 (before patience 30)", "quality-recipe",
                "Hinge recipe, with and without pedal caution", "the same runs", ("default", "shift-3", "random", "color-v0")),
    *(HeadlineRow(f"Demo recipe (`make demo`, after its DAgger round), tracks 42 and 1000–1009, {condition}, laps per seed",
                  "demo-recipe", "The shipped demo recipe, behaviour cloning and its DAgger round",
                  ("runs/demo-dagger/runs/round-1", condition), ("laps per seed (%)", "score")) for condition in ("default", "shift-3")),
    HeadlineRow("Lévy quality recipe, laps per seed 0–4", "levy-gmle", "Five seeds and Polyak averaging",
                "Lévy BC, `configs/quality-levy.json`", ("default", "shift-3")),
    HeadlineRow("Front camera, β-NLL fine-tune + DAgger, pedal caution 0.5, laps per seed", "front-camera", "Two pedal levers",
                "+ 6 epochs β-NLL 0.5, then one DAgger round (`runs/bnll-dagger-sS`, above)",
                ("42, 1000–1009: default", "shift-3")),
    HeadlineRow("PPO expert (state recipe) on tracks 1000–1099, mean ± std over training seeds 0, 1, 2", "ppo-expert",
                "State recipe on held-out tracks, training seeds 0-2, 600k decisions", "mean ± std over seeds",
                ("score (mean ± std)", "laps finished", "training (minutes)")),
    HeadlineRow("Eight models offline, clean steering CRPS: NSAC", "offline-comparison", "Clean test tracks", "nsac",
                ("CRPS (95 % episode interval)",)),
    HeadlineRow("… the best of the eight, the deep ensemble", "offline-comparison", "Clean test tracks", "ensemble",
                ("CRPS (95 % episode interval)",)),
    HeadlineRow("Misbehaviour monitor (NSAC), density over tokens: F3 / FPR / AUROC / stratified AUROC", "misbehaviour",
                "30-epoch hinge runs: monitors", "density over tokens", ("seeds 0, 1, 2 (mean ± std)",)),
    HeadlineRow("Expert fallback on the density over tokens + convolutions, failures prevented", "misbehaviour",
                "30-epoch hinge runs: expert fallback", "over tokens + convolutions", ("prevented",)),
    HeadlineRow("Safety protocol, the quality recipe's NSAC, leave one family out (families nobody tuned to)", "safety-protocol-quality",
                "Leave one family out", "**pooled, mean ± std**", ("F3 at 1 s", "F3 at 3 s", "FPR (1 s, clean laps)")),
    HeadlineRow("… the `stop` fallback on the test families (nothing privileged)", "safety-protocol-quality", "Fallback stop",
                "**all test families**", ("prevented", "ended safely")),
)


class ResultsError(ValueError):
    """A results file is unreadable or breaks the schema; the message names the file and field."""


@dataclass(frozen=True)
class Layout:
    """Where the results live: the repository root (configs are resolved against it), the JSON
    folder, the generated pages' folder and the README whose headline table is replaced."""

    root: Path
    results: Path
    docs: Path
    readme: Path

    @classmethod
    def of(cls, root: Path) -> Layout:
        """The repository's own layout under ``root``."""
        return cls(root, root / "results", root / "docs" / "results", root / "README.md")

    def name(self, path: Path) -> str:
        """``path`` relative to the root, as messages and links show it."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


# ---------------------------------------------------------------- reading and validating


def load_study(path: Path, layout: Layout) -> dict[str, Any]:
    """The study in ``path``, validated against the schema; :class:`ResultsError` names the file."""
    where = layout.name(path)
    try:
        study = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{where}: not readable JSON ({exc})") from exc
    validate_study(study, path.stem, where)
    return study


def validate_study(study: Any, stem: str, where: str) -> None:
    """Raise :class:`ResultsError` for the first way ``study`` breaks the schema."""
    _require_object(study, STUDY_KEYS, where, "the file")
    if study["study"] != stem:
        raise ResultsError(f"{where}: 'study' is {study['study']!r}, the file's stem is {stem!r}")
    _require_text(study["title"], where, "'title'")
    validate_provenance(study["provenance"], where, "provenance")
    tables = study["tables"]
    if not isinstance(tables, list) or not tables:
        raise ResultsError(f"{where}: 'tables' must be a non-empty list")
    names = set()
    for k, table in enumerate(tables):
        _require_object(table, TABLE_KEYS - {"provenance"}, where, f"table {k}", optional={"provenance"})
        if table["name"] in names:
            raise ResultsError(f"{where}: two tables are named {table['name']!r}")
        names.add(table["name"])
        validate_table(table, where)


def validate_table(table: dict[str, Any], where: str) -> None:
    """Columns and rows of one table: text headers, rows as long as the header, cells text/number/null."""
    label = f"table {table['name']!r}"
    _require_text(table["name"], where, f"{label} 'name'")
    _require_text(table["caption"], where, f"{label} 'caption'", empty=True)
    columns, rows = table["columns"], table["rows"]
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise ResultsError(f"{where}: {label} 'columns' must be a non-empty list of text")
    if not isinstance(rows, list) or not rows:
        raise ResultsError(f"{where}: {label} 'rows' must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise ResultsError(f"{where}: {label} row {i} must be a list of {len(columns)} cells")
        for cell in row:
            if isinstance(cell, bool) or not (cell is None or isinstance(cell, (str, int, float))):
                raise ResultsError(f"{where}: {label} row {i} holds {cell!r}; cells are text, numbers or null")
    for text in [table["name"], table["caption"], *columns, *(c for row in rows for c in row if isinstance(c, str))]:
        match = PROVENANCE_ONLY.search(text)
        if match:
            raise ResultsError(f"{where}: {label} holds {match.group()!r}: dates and commits belong in its provenance")
    if "provenance" in table:
        validate_provenance(table["provenance"], where, f"{label} provenance")


def validate_provenance(provenance: Any, where: str, label: str) -> None:
    """Every key of :data:`PROVENANCE_KEYS` present and of its type; "recovered" comes with a "note"."""
    if not isinstance(provenance, dict):
        raise ResultsError(f"{where}: {label} must be an object")
    for key in PROVENANCE_KEYS:
        if key not in provenance:
            raise ResultsError(f"{where}: {label} lacks {key!r}")
    unknown = set(provenance) - set(PROVENANCE_KEYS) - OPTIONAL_PROVENANCE_KEYS
    if unknown:
        raise ResultsError(f"{where}: {label} has unknown keys {sorted(unknown)}")
    commands = provenance["command"]
    if not isinstance(commands, list) or not commands or not all(isinstance(c, str) and c.strip() for c in commands):
        raise ResultsError(f"{where}: {label} 'command' must be a non-empty list of commands")
    for key in ("commit", "date"):
        if provenance[key] is not None and not isinstance(provenance[key], str):
            raise ResultsError(f"{where}: {label} {key!r} must be text or null")
    if provenance["dirty"] is not None and not isinstance(provenance["dirty"], bool):
        raise ResultsError(f"{where}: {label} 'dirty' must be true, false or null")
    _require_fields(provenance["machine"], MACHINE_KEYS, where, f"{label} 'machine'")
    _require_fields(provenance["versions"], VERSION_KEYS, where, f"{label} 'versions'")
    configs = provenance["config_sha256"]
    if not isinstance(configs, dict) or not all(isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in configs.values()):
        raise ResultsError(f"{where}: {label} 'config_sha256' must map config paths to sha256 hex digests")
    seeds = provenance["seeds"]
    if not isinstance(seeds, list) or not all(isinstance(s, (int, str)) and not isinstance(s, bool) for s in seeds):
        raise ResultsError(f"{where}: {label} 'seeds' must be a list of seeds")
    if "recovered" in provenance:
        if provenance["recovered"] is not False and not isinstance(provenance["recovered"], str):
            raise ResultsError(f"{where}: {label} 'recovered' must be false or say how it was recovered")
        _require_text(provenance.get("note"), where, f"{label} 'note' (required with 'recovered')")


def _require_object(value: Any, keys: set[str], where: str, label: str, optional: set[str] = frozenset()) -> None:
    if not isinstance(value, dict):
        raise ResultsError(f"{where}: {label} must be an object")
    missing = sorted(keys - set(value))
    if missing:
        raise ResultsError(f"{where}: {label} lacks {missing[0]!r}")
    unknown = sorted(set(value) - keys - optional)
    if unknown:
        raise ResultsError(f"{where}: {label} has unknown keys {unknown}")


def _require_fields(value: Any, keys: tuple[str, ...], where: str, label: str) -> None:
    if not isinstance(value, dict):
        raise ResultsError(f"{where}: {label} must be an object")
    for key in keys:
        if key not in value:
            raise ResultsError(f"{where}: {label} lacks {key!r}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ResultsError(f"{where}: {label} has unknown keys {unknown}")
    for key in keys:
        if value[key] is not None and not isinstance(value[key], (str, int)) or isinstance(value[key], bool):
            raise ResultsError(f"{where}: {label} {key!r} must be text, a number or null")


def _require_text(value: Any, where: str, label: str, empty: bool = False) -> None:
    if not isinstance(value, str) or not (empty or value.strip()):
        raise ResultsError(f"{where}: {label} must be {'text' if empty else 'non-empty text'}")


# ---------------------------------------------------------------- staleness


def file_sha256(path: Path) -> str | None:
    """sha256 of ``path``'s bytes; None when it does not exist."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def stale_configs(provenance: dict[str, Any], root: Path) -> list[str]:
    """The configs of ``provenance`` whose file under ``root`` differs from the one run, or is gone."""
    return [name for name, digest in sorted(provenance["config_sha256"].items()) if file_sha256(root / name) != digest]


# ---------------------------------------------------------------- rendering


def render_cell(cell: str | int | float | None) -> str:
    """A cell as Markdown: text as given (newlines folded, a bare ``|`` escaped so it stays in its
    cell), numbers as Python prints them, null as "–"."""
    if cell is None:
        return "–"
    return UNESCAPED_PIPE.sub(r"\\|", " ".join(cell.split("\n"))) if isinstance(cell, str) else repr(cell)


def render_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(render_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(render_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_provenance(provenance: dict[str, Any]) -> str:
    """The provenance block: a small table, then the commands; the only place for dates, machines and commits."""
    machine, versions = provenance["machine"], provenance["versions"]
    commit = f"`{provenance['commit']}`" if provenance["commit"] else "not recorded"
    dirty = {True: " (uncommitted changes)", False: " (clean)", None: ""}[provenance["dirty"]]
    rows = [["commit", commit + dirty],
            ["date", provenance["date"] or "not recorded"],
            ["machine", _machine_text(machine)],
            ["versions", ", ".join(f"{k} {versions[k] if versions[k] is not None else '?'}" for k in VERSION_KEYS)],
            ["configs", "<br>".join(f"`{k}` sha256 `{v}`" for k, v in sorted(provenance["config_sha256"].items())) or "none"],
            ["seeds", ", ".join(map(str, provenance["seeds"])) or "none"]]
    if "recovered" in provenance:
        recovered = provenance["recovered"]
        rows.append(["recovered", "no: figures carried over, their run is not recoverable" if recovered is False else recovered])
    if "note" in provenance:
        rows.append(["note", provenance["note"]])
    commands = "\n".join(provenance["command"])
    return "\n".join([PROVENANCE_START, render_table(["provenance", ""], rows), "", "Commands, exactly as run:", "",
                      "```bash", commands, "```", PROVENANCE_END])


def _machine_text(machine: dict[str, Any]) -> str:
    cpu = machine["cpu"] or "CPU not recorded"
    cores = f", {machine['cores']} cores" if machine["cores"] is not None else ""
    return f"{cpu}{cores}, GPU: {machine['gpu'] or 'none'}"


def render_stale(stale: list[str], provenance: dict[str, Any]) -> str:
    """The visible warning for figures whose recipe has changed, with the commands that refresh them."""
    configs = ", ".join(f"`{name}`" for name in stale)
    commands = "\n".join(f">     {command}" for command in provenance["command"])
    return (f"> **Stale:** {configs} changed since these figures were made, so they may not be what the recipe "
            f"gives today. Refresh them with:\n>\n{commands}")


def render_study(study: dict[str, Any], layout: Layout) -> str:
    """The page ``docs/results/<study>.md``: header, provenance, then each table (with its own provenance if any)."""
    source = f"results/{study['study']}.json"
    provenance = study["provenance"]
    parts = [GENERATED.format(source=source), "", f"# {study['title']}", ""]
    stale = stale_configs(provenance, layout.root)
    if stale:
        parts += [render_stale(stale, provenance), ""]
    parts += [render_provenance(provenance), ""]
    for table in study["tables"]:
        parts += [f"## {table['name']}", ""]
        if table.get("provenance", provenance) != provenance:  # the study's own is shown once, above
            own = stale_configs(table["provenance"], layout.root)
            parts += [render_stale(own, table["provenance"]), ""] if own else []
            parts += [render_provenance(table["provenance"]), ""]
        parts += [table["caption"], ""] if table["caption"] else []
        parts += [render_table(table["columns"], table["rows"]), ""]
    return "\n".join(parts)


def table_provenance(study: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The provenance a table's figures come with: its own, else the study's."""
    return table.get("provenance", study["provenance"])


def stale_tables(study: dict[str, Any], layout: Layout) -> list[str]:
    """Names of the study's tables whose recipe changed since their figures were made."""
    return [t["name"] for t in study["tables"] if stale_configs(table_provenance(study, t), layout.root)]


def render_index(studies: list[dict[str, Any]], layout: Layout) -> str:
    """``docs/results/index.md``: every study, its file, and how many of its tables are stale."""
    rows = [[f"[{s['title']}]({s['study']}.md)", f"`results/{s['study']}.json`", len(s["tables"]),
             len(stale_tables(s, layout))] for s in studies]
    return "\n".join([GENERATED.format(source="results/*.json"), "", "# Results", "",
                      "Every table here is rendered from a JSON file under `results/` (`make results`); "
                      "`make results-check` fails when a page differs from its file. What the figures mean, and how they were reached, is written by hand in the [engineering notes](../engineering-notes.md).", "",
                      render_table(["study", "file", "tables", "stale tables"], rows), ""])


def render_headline(studies: dict[str, dict[str, Any]], layout: Layout) -> str:
    """The README's headline table from :data:`HEADLINE`; no provenance, a link to each study's page."""
    rows = []
    for entry in HEADLINE:
        table = _headline_table(studies, entry)
        row = next((r for r in table["rows"] if entry.matches(r)), None)
        if row is None:
            raise ResultsError(f"results/{entry.study}.json: table {entry.table!r} has no row {entry.row!r} for the headline")
        cells = []
        for column in entry.columns:
            if column not in table["columns"]:
                raise ResultsError(f"results/{entry.study}.json: table {entry.table!r} has no column {column!r} for the headline")
            value = render_cell(row[table["columns"].index(column)])
            cells.append(value if len(entry.columns) == 1 else f"{column}: {value}")
        stale = " (stale)" if entry.table in stale_tables(studies[entry.study], layout) else ""
        rows.append([entry.label, "; ".join(cells), f"[{entry.study}](docs/results/{entry.study}.md){stale}"])
    note = "<!-- generated from results/*.json by `make results`: do not edit between these markers -->"
    return "\n".join([note, "", render_table(["result", "figures", "details"], rows), ""])


def _headline_table(studies: dict[str, dict[str, Any]], entry: HeadlineRow) -> dict[str, Any]:
    if entry.study not in studies:
        raise ResultsError(f"results/{entry.study}.json: missing, and the README's headline table needs it")
    table = next((t for t in studies[entry.study]["tables"] if t["name"] == entry.table), None)
    if table is None:
        raise ResultsError(f"results/{entry.study}.json: no table {entry.table!r}, which the README's headline table needs")
    return table


def replace_headline(readme: str, headline: str, where: str) -> str:
    """``readme`` with the text between the headline markers replaced; the rest byte for byte as it was."""
    start, end = readme.find(HEADLINE_START + "\n"), readme.find(HEADLINE_END)
    if start < 0 or end < 0 or end < start or readme.count(HEADLINE_START) != 1 or readme.count(HEADLINE_END) != 1:
        raise ResultsError(f"{where}: needs the marker lines {HEADLINE_START} and {HEADLINE_END}, once each and in "
                           "this order, around the headline table")
    body_start = start + len(HEADLINE_START) + 1
    return readme[:body_start] + headline + readme[end:]


def rendered(layout: Layout) -> tuple[dict[Path, str], list[str]]:
    """Every generated file's text by path, and the problems that kept some from being rendered (a
    study that breaks the schema has no page; a README without its markers is left out)."""
    problems, studies = [], {}
    for path in sorted(layout.results.glob("*.json")):
        try:
            studies[path.stem] = load_study(path, layout)
        except ResultsError as exc:
            problems.append(str(exc))
    files = {layout.docs / f"{stem}.md": render_study(study, layout) for stem, study in studies.items()}
    files[layout.docs / "index.md"] = render_index(list(studies.values()), layout)
    try:
        readme = layout.readme.read_text()
        files[layout.readme] = replace_headline(readme, render_headline(studies, layout), layout.name(layout.readme))
    except (OSError, ResultsError) as exc:
        problems.append(str(exc) if isinstance(exc, ResultsError) else f"{layout.name(layout.readme)}: {exc}")
    return files, problems


def orphans(layout: Layout, files: dict[Path, str]) -> list[Path]:
    """Generated pages under the docs folder whose JSON is gone."""
    generated = GENERATED.split("{source}")[0]
    return [p for p in sorted(layout.docs.glob("*.md")) if p not in files and p.read_text().startswith(generated)]


def render(layout: Layout) -> list[str]:
    """Write every generated file that changed, remove orphaned pages; the problems found (files are
    still written for the studies that render)."""
    files, problems = rendered(layout)
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            atomic_write_bytes(path, text.encode())
    for path in orphans(layout, files):
        path.unlink()
    return problems


def check(layout: Layout) -> list[str]:
    """Every file that differs from what the JSON gives, every schema problem; empty when all agree."""
    files, problems = rendered(layout)
    for path, text in files.items():
        source = "results/*.json give" if path.name == "index.md" or path == layout.readme else f"results/{path.stem}.json gives"
        if not path.exists():
            problems.append(f"{layout.name(path)} is missing: run `make results`")
        elif path.read_text() != text:
            problems.append(f"{layout.name(path)} differs from what {source}: run `make results`")
    problems += [f"{layout.name(p)} has no results/{p.stem}.json: run `make results` to remove it" for p in orphans(layout, files)]
    return problems


# ---------------------------------------------------------------- writing a results file


def recorded_arguments(argv: list[str], flags: tuple[str, ...] = ("--written",), options: tuple[str, ...] = ()) -> list[str]:
    """``argv`` as a study records its own command: without ``flags`` (such as ``--written``, which
    only says how the figures were read) and without ``options`` and their values (recorded apart)."""
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
        elif argument in options:
            skip = True
        elif argument not in flags:
            kept.append(argument)
    return kept


def current_provenance(commands: list[str], configs: list[str | Path], seeds: list[int | str], root: Path = REPO,
                       note: str | None = None) -> dict[str, Any]:
    """Provenance of a run made now on this machine: git HEAD and dirtiness of ``root``, CPU, cores,
    GPU, package versions, the sha256 of each config (paths relative to ``root``), the seeds, and
    ``note`` when given (what a reader must know of how the runs were made)."""
    versions = current_versions()
    config_sha256 = {}
    for config in configs:
        path = root / config
        digest = file_sha256(path)
        if digest is None:
            raise ResultsError(f"{config}: config not found under {root}")
        config_sha256[path.relative_to(root).as_posix()] = digest
    commit, dirty = _git(root, "rev-parse", "HEAD"), _git(root, "status", "--porcelain")
    return {"command": list(commands), "commit": commit or None, "dirty": None if dirty is None else bool(dirty),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_name()},
            "versions": {key: versions.get(key) for key in VERSION_KEYS},
            "config_sha256": config_sha256, "seeds": list(seeds), **({"note": note} if note else {})}


def write_results(study: str, title: str, tables: list[dict[str, Any]], provenance: dict[str, Any], root: Path = REPO) -> Path:
    """Validate and write ``results/<study>.json`` under ``root`` atomically; returns its path.
    ``provenance`` is usually :func:`current_provenance`'s."""
    data = {"study": study, "title": title, "provenance": provenance, "tables": tables}
    path = Layout.of(root).results / f"{study}.json"
    validate_study(data, study, f"results/{study}.json")
    atomic_write_json(path, data)
    return path


def put_table(study: str, table: dict[str, Any], root: Path = REPO, title: str | None = None) -> Path:
    """Add ``table`` (with its own provenance) to ``results/<study>.json``, replacing the table of the same
    name, validated and written atomically; returns the file's path. Given ``title``, a missing file is
    started with the table, whose provenance becomes the file's."""
    layout = Layout.of(root)
    path = layout.results / f"{study}.json"
    if title is not None and not path.exists():
        return write_results(study, title, [table], table["provenance"], root)
    data = load_study(path, layout)
    data["tables"] = [t for t in data["tables"] if t["name"] != table["name"]] + [table]
    validate_study(data, study, f"results/{study}.json")
    atomic_write_json(path, data)
    return path


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def gpu_name() -> str | None:
    """The first CUDA device's name, None without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("render", "check"))
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    layout = Layout.of(args.root.resolve())
    problems = render(layout) if args.action == "render" else check(layout)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
