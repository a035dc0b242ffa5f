"""aot's packages import only downwards, in the layers docs/CONTRIBUTING.md declares (function-level imports too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aot

PACKAGE = Path(aot.__file__).resolve().parent
CONTRIBUTING = PACKAGE.parent / "docs" / "CONTRIBUTING.md"


def declared_layers() -> dict[str, int]:
    """``{package: layer}`` from the fenced block after the ``<!-- layers`` marker; 0 is the bottom."""
    text = CONTRIBUTING.read_text(encoding="utf-8")
    block = re.search(r"<!-- layers:[^\n]*-->\s*```text\n(.*?)```", text, re.DOTALL)
    assert block, f"{CONTRIBUTING}: no layers block"
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    return {name.strip(): len(lines) - 1 - i for i, line in enumerate(lines) for name in line.split(",")}


def package_of(path: Path) -> str:
    """``aot/builder/steps.py`` -> ``builder``; a loose module (``aot/models.py``) is a package of its own."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """``(line, package)`` of every aot import in ``path``, wherever it stands (function bodies included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "aot" else [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[1]) for name in names if name.startswith("aot.")]
    return found


def test_every_package_of_aot_has_a_declared_layer():
    layers = declared_layers()
    assert len(layers) >= 20, layers  # precondition: the block was read
    packages = {package_of(path) for path in PACKAGE.rglob("*.py")} - {"schema"}
    assert len(packages) >= 20, packages  # precondition: the walk saw the package
    assert not packages - set(layers), f"add these to the layers block of {CONTRIBUTING.name}: {sorted(packages - set(layers))}"
    assert not set(layers) - packages, f"the layers block names packages that are gone: {sorted(set(layers) - packages)}"


def test_every_import_goes_down_a_layer():
    layers = declared_layers()
    seen, upward = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = package_of(path)
        for line, target in imported_packages(path):
            if target == source or target not in layers:
                continue
            seen += 1
            if layers[target] >= layers[source]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source} (layer {layers[source]}) imports {target} (layer {layers[target]})")
    assert seen > 150  # precondition: imports between packages were found
    assert not upward, "imports that do not go down a layer:\n" + "\n".join(upward)


def test_the_check_sees_function_level_imports(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from aot.cli import main\n    import aot.builder.spine\n    from aot import export\n")
    assert [package for _, package in imported_packages(module)] == ["cli", "builder", "export"]
