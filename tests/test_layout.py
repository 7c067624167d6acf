"""DESIGN's rules of the house, checked on the sources: the runtime (``distgnn/``) imports of the partition tool
only its on-disk format module; the partition tool never imports the server or rpc code; the launcher imports
nothing of the rest."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, lazy ones inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _violations(directory: str, forbidden, allowed=()) -> list[str]:
    bad = []
    for path in sorted((ROOT / directory).rglob("*.py")):
        for line, module in _imports(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden) and not any(
                module == a or module.startswith(a + ".") for a in allowed
            ):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize(
    "directory, forbidden, allowed",
    [
        ("distgnn", ["distgnn.partition"], ["distgnn.partition.format"]),
        ("partition", ["distgnn.server", "distgnn.rpc"], []),
        ("launch", ["distgnn", "torch", "numpy"], ["distgnn.launch"]),
    ],
)
def test_imports_follow_the_layout(directory, forbidden, allowed):
    assert _violations(directory, forbidden, allowed) == []
