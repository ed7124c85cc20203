"""Layers point one way and no two modules import each other, deferred imports included.

The layers, lowest first: common < envs < agents < data_collection < controllers < eval <
eval.explain, eval.serve < the command line (``nsacdrive.cli``, ``nsacdrive.udacity_cli`` and
their helpers in the root package). A module may import its own layer and the ones below. Every
``import`` counts wherever it stands — at the top, inside a function, under ``if TYPE_CHECKING`` —
because a deferred import still ties the two modules together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LAYERS: tuple[tuple[str, ...], ...] = (
    ("nsacdrive.common",),
    ("nsacdrive.envs",),
    ("nsacdrive.agents",),
    ("nsacdrive.data_collection",),
    ("nsacdrive.controllers",),
    ("nsacdrive.eval",),
    ("nsacdrive.eval.explain", "nsacdrive.eval.serve"),
    ("nsacdrive",),  # the command line
)


@dataclass(frozen=True)
class Import:
    """One first-party import: who imports what, on which line, and whether it is deferred."""

    importer: str
    imported: str
    line: int
    deferred: bool  # not a top-level statement of its module (in a function, an if, a try)

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}{' (deferred)' if self.deferred else ''}"


def package_dirs(root: Path) -> dict[str, Path]:
    """Package → folder, from ``[tool.setuptools.package-dir]`` in ``root/pyproject.toml``."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in table.items()}


def module_files(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Module name → file, for the ``.py`` files directly in each package folder."""
    modules = {}
    for package, folder in packages.items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _resolve(name: str, modules: Iterable[str]) -> str | None:
    """The longest known module that ``name`` starts with (None: not first-party)."""
    matches = [m for m in modules if name == m or name.startswith(m + ".")]
    return max(matches, key=len) if matches else None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every first-party import in ``path`` (the file of ``module``), resolved to a module name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.append(Import(module, target, node.lineno, id(node) not in top_level))
    return found


def all_imports(modules: Mapping[str, Path]) -> list[Import]:
    return [imp for module, path in sorted(modules.items()) for imp in imports_of(module, path, modules)]


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the most specific package holding ``module``."""
    best = max((package for layer in LAYERS for package in layer if module == package or module.startswith(package + ".")),
               key=len, default=None)
    if best is None:
        raise ValueError(f"{module}: in no layer")
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def upward_imports(imports: Iterable[Import]) -> list[str]:
    """The imports that point to a higher layer than their importer's."""
    return [f"{imp}: layer {'/'.join(LAYERS[layer_of(imp.imported)])} is above {'/'.join(LAYERS[layer_of(imp.importer)])}"
            for imp in imports if layer_of(imp.imported) > layer_of(imp.importer)]


def import_cycles(imports: Iterable[Import]) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) per group of modules that import each other (Tarjan's strongly
    connected components of the import graph)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
        graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & members):
                if successor == start:
                    return paths[node] + [start]
                if successor not in paths:
                    paths[successor] = paths[node] + [successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{component}: not a cycle")


# ------------------------------------------------------------------------------ the real tree


@pytest.fixture(scope="module")
def project_imports() -> list[Import]:
    return all_imports(module_files(package_dirs(ROOT)))


def test_every_installed_package_has_a_layer():
    assert set(package_dirs(ROOT)) == {package for layer in LAYERS for package in layer}


def test_the_checker_sees_the_whole_package(project_imports):
    modules = module_files(package_dirs(ROOT))
    assert {"nsacdrive.cli", "nsacdrive.agents.registry", "nsacdrive.eval.explain.report", "nsacdrive.common.atomic"} <= set(modules)
    assert any(imp.deferred for imp in project_imports)  # the CLI's lazy per-command imports


def test_no_module_imports_a_layer_above_its_own(project_imports):
    assert upward_imports(project_imports) == []


def test_no_modules_import_each_other(project_imports):
    assert [" → ".join(cycle) for cycle in import_cycles(project_imports)] == []


def _touches_sys_path(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"]


def test_tests_and_benchmarks_never_touch_sys_path():
    offenders = {str(path.relative_to(ROOT)): lines for folder in ("tests", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
                 if (lines := _touches_sys_path(path))}
    assert offenders == {}


# ------------------------------------------------------------------------------ the checker itself


def _synthetic_tree(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    """Write ``files`` (path → source) under ``root`` with this project's package-dir table."""
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for folder in package_dirs(root).values():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()
    for relative, source in files.items():
        (root / relative).write_text(source)
    return module_files(package_dirs(root))


def test_the_checker_catches_an_upward_import_deferred_into_a_function(tmp_path):
    modules = _synthetic_tree(tmp_path, {
        "agents/registry.py": "def controller(run):\n    from nsacdrive.eval.driver import ControllerAgent\n    return ControllerAgent(run)\n",
        "eval/driver.py": "from nsacdrive.agents import registry\n",
    })
    assert upward_imports(all_imports(modules)) == [
        "nsacdrive.agents.registry:2 imports nsacdrive.eval.driver (deferred): layer nsacdrive.eval is above nsacdrive.agents"
    ]


def test_the_checker_catches_a_relative_import_of_the_command_line_from_the_report(tmp_path):
    modules = _synthetic_tree(tmp_path, {
        "eval/explain/report.py": "from ... import cli\nfrom ..closed_loop import run_episode\n",
        "eval/closed_loop.py": "",
        "nsacdrive/cli.py": "",
    })
    imports = all_imports(modules)
    assert {imp.imported for imp in imports} == {"nsacdrive.cli", "nsacdrive.eval.closed_loop"}
    assert [problem.split(":")[0] for problem in upward_imports(imports)] == ["nsacdrive.eval.explain.report"]


def test_the_checker_catches_cycles_behind_type_checking_and_deferred_imports(tmp_path):
    modules = _synthetic_tree(tmp_path, {
        "controllers/registry.py": "from nsacdrive.controllers.baselines import EnsembleController\n",
        "controllers/baselines.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from nsacdrive.controllers.registry import ModelConfig\n",
        "data_collection/dataset.py": "def folder(part):\n    from nsacdrive.data_collection.udacity_import import udacity_dataset\n",
        "data_collection/udacity_import.py": "from nsacdrive.data_collection.dataset import DatasetError\n",
    })
    imports = all_imports(modules)
    assert upward_imports(imports) == []
    assert import_cycles(imports) == [
        ["nsacdrive.controllers.baselines", "nsacdrive.controllers.registry", "nsacdrive.controllers.baselines"],
        ["nsacdrive.data_collection.dataset", "nsacdrive.data_collection.udacity_import", "nsacdrive.data_collection.dataset"],
    ]


def test_the_checker_finds_a_longer_cycle_and_ignores_third_party_imports(tmp_path):
    modules = _synthetic_tree(tmp_path, {
        "envs/a.py": "import numpy\nimport nsacdrive.envs.b\n",
        "envs/b.py": "from nsacdrive.envs import c\n",
        "envs/c.py": "from nsacdrive.envs.a import thing\n",
    })
    assert import_cycles(all_imports(modules)) == [["nsacdrive.envs.a", "nsacdrive.envs.b", "nsacdrive.envs.c", "nsacdrive.envs.a"]]


def test_the_tree_a_sys_path_insert_would_break_is_reported(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("import sys\nsys.path.insert(0, '..')\n")
    assert _touches_sys_path(script) == [2]
