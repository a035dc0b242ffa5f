"""aot's modules import each other without a circle, type-checking imports included: each can be read bottom-up."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import aot

PACKAGE = Path(aot.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ("aot", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path, known: set[str]) -> set[str]:
    """The aot modules ``path`` imports outside functions (an import inside a function is a deliberate late one)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scopes = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.If)]  # `if TYPE_CHECKING:` too
    for statement in (node for body in scopes for node in body):
        if isinstance(statement, ast.ImportFrom) and statement.module and statement.module.split(".")[0] == "aot":
            for alias in statement.names:
                full = f"{statement.module}.{alias.name}"
                found.add(full if full in known else statement.module)
        elif isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names if alias.name.split(".")[0] == "aot")
    return found & known


def test_no_module_of_aot_imports_in_a_circle():
    files = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _module_level_imports(path, set(files)) - {name} for name, path in files.items()}
    assert len(graph) > 60 and sum(map(len, graph.values())) > 100  # precondition: the walk saw the package and its imports
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle
