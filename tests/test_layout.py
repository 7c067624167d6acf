"""The layout of docs/architecture.md, checked on the sources: the top level the design names, which component
may import which (a DAG, every import pointing down), nothing loose at the top of ``distgnn/``, no import circle
between modules, each component's ``__init__`` docstring naming what it may import, and the installed package
matching the three source roots (``distgnn/``, ``partition/`` and ``launch/``, the last two installed as
``distgnn.partition`` and ``distgnn.launch``)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distgnn"
# Source folder -> the package it is installed as.
ROOTS = {"distgnn": "distgnn", "partition": "distgnn.partition", "launch": "distgnn.launch"}
# The design's top level (besides docs, scripts, benchmarks and the project's dot-files).
DESIGN_TOP_LEVEL = {
    "pyproject.toml",
    "distgnn",
    "partition",
    "launch",
    "csrc",
    "ip_config.example",
    "tests",
    "examples",
}

# Component -> the components it may import (besides itself). The ground (errors, config, launch) comes first.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "launch": set(),
    "config": {"errors", "launch"},
    "native": {"errors"},
    "store": {"errors"},
    "data": {"errors"},
    "partition": {"errors", "launch", "data"},
    "rpc": {"errors", "config"},
    "sampling": {"errors", "native", "data", "partition"},
    "server": {"errors", "config", "native", "store", "data", "partition", "rpc", "sampling"},
    "client": {"errors", "config", "native", "store", "data", "partition", "rpc", "sampling"},
    "loader": {"errors", "config", "native", "data", "partition", "sampling", "client"},
    "nn": {"errors", "native", "data", "partition", "sampling", "client"},
    "cache": {"errors", "config", "native", "data", "partition", "sampling", "client", "loader"},
}
ALLOWED["train"] = set(ALLOWED) - {"train"}
ALLOWED["temporal"] = set(ALLOWED) - {"temporal"}
ALLOWED["snapshot"] = set(ALLOWED) - {"snapshot", "temporal"}
ALLOWED["temporal"].discard("snapshot")
# Of the partition tool, the runtime reads only the on-disk format and the partition book.
PARTITION_FOR_OTHERS = ("distgnn.partition.format", "distgnn.partition.book")
TOP_LEVEL = {"__init__.py", "errors.py", "config.py"}


def _modules() -> dict[str, Path]:
    """Installed module name -> its source file, over the three roots."""
    found = {}
    for folder, package in ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _component_dir(component: str) -> Path:
    return ROOT / component if component in ("partition", "launch") else PACKAGE / component


def test_top_level_is_the_designs() -> None:
    present = {p.name for p in ROOT.iterdir()}
    assert present >= DESIGN_TOP_LEVEL, f"missing at the top: {sorted(DESIGN_TOP_LEVEL - present)}"
    assert not (PACKAGE / "partition").exists() and not (PACKAGE / "launch").exists()


def test_installed_modules_are_the_source_tree() -> None:
    """Every source module imports as its installed name from its source file, and neither mapped folder is
    importable under a name of its own (run from outside the checkout, as a user's script would be)."""
    modules = {name: str(path) for name, path in _modules().items() if not name.endswith("__main__")}
    probe = (
        "import importlib.util, json, sys\n"
        "names = json.loads(sys.stdin.read())\n"
        "origins = {n: importlib.util.find_spec(n).origin for n in names}\n"
        "print(json.dumps([origins, [importlib.util.find_spec(t) is None for t in ('partition', 'launch')]]))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", probe], input=json.dumps(sorted(modules)), capture_output=True, text=True, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    origins, absent = json.loads(out.stdout)
    wrong = {n: o for n, o in origins.items() if Path(o).resolve() != Path(modules[n]).resolve()}
    assert wrong == {}
    assert absent == [True, True], "partition/ and launch/ must be importable only inside distgnn"


def test_setup_lists_every_package() -> None:
    # setup.py's package list alone (its build imports need pybind11, which only the build environment has).
    tree = ast.parse((ROOT / "setup.py").read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "packages"]
    wanted += [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id in ("ROOT", "MAPPED")
    ]
    namespace: dict = {"Path": Path, "__file__": str(ROOT / "setup.py")}
    exec(compile(ast.Module(sorted(wanted, key=lambda n: n.lineno), []), "setup.py", "exec"), namespace)
    listed, package_dir = namespace["packages"]()
    expected = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert set(listed) == expected
    assert package_dir == {"distgnn.partition": "partition", "distgnn.launch": "launch"}


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "distgnn"


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``path``, lazy ones inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _distgnn_imports(modules: dict[str, Path]):
    """``(importer, line, imported module)`` for every import of a distgnn module: ``from pkg import name``
    counts as an import of ``pkg.name`` where that is a module, else of ``pkg``."""
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] != "distgnn":
                    continue
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    yield name, node.lineno, target


def test_components_form_a_dag() -> None:
    try:
        order = list(TopologicalSorter(ALLOWED).static_order())
    except CycleError as err:  # pragma: no cover - the table above is the thing tested
        pytest.fail(f"the allowed imports have a circle: {err.args[1]}")
    assert set(order) == set(ALLOWED)


def test_top_level_holds_only_the_ground() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in TOP_LEVEL)
    assert loose == [], "modules belong in a component's folder"
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert set(folders) <= set(ALLOWED), f"a component without a row in ALLOWED: {set(folders) - set(ALLOWED)}"


def test_imports_point_down() -> None:
    modules = _modules()
    bad = []
    for importer, line, target in _distgnn_imports(modules):
        source, dest = _component(importer), _component(target)
        if source == dest or source == "distgnn":  # the package root names its exports lazily
            continue
        where = f"{modules[importer].relative_to(ROOT)}:{line} imports {target}"
        if dest == "distgnn":
            bad.append(f"{where} (import the module that defines the name)")
        elif dest not in ALLOWED[source]:
            bad.append(f"{where} ({source} may import {sorted(ALLOWED[source])})")
        elif dest == "partition" and not target.startswith(PARTITION_FOR_OTHERS):
            bad.append(f"{where} (only {', '.join(PARTITION_FOR_OTHERS)} of the partition tool)")
    assert bad == []


def test_launch_needs_no_third_party_package() -> None:
    third_party = ("torch", "numpy", "zmq", "msgpack", "scipy", "pymetis")
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "launch").rglob("*.py"))
        for line, module in _imports(path)
        if module.split(".")[0] in third_party
    ]
    assert bad == []


def test_no_import_circle_between_modules() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, _, target in _distgnn_imports(modules):
        graph[importer].add(target)
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")


@pytest.mark.parametrize("component", sorted(c for c in ALLOWED if (_component_dir(c) / "__init__.py").exists()))
def test_component_docstring_names_its_imports(component: str) -> None:
    doc = ast.get_docstring(ast.parse((_component_dir(component) / "__init__.py").read_text())) or ""
    assert doc, f"distgnn/{component}/__init__.py needs a docstring saying what it holds and may import"
    match = re.search(r"May import:?\s*([^.]*)\.", doc.replace("\n", " "))
    if component in ("train", "temporal", "snapshot"):
        assert "May import every component" in doc.replace("\n", " ")
        return
    assert match, f"distgnn/{component}/__init__.py: the docstring should say 'May import: ...'"
    named = {w.strip() for w in match.group(1).split(",") if w.strip()}
    assert named == ALLOWED[component] or (named == {"nothing else of distgnn"} and not ALLOWED[component])
