"""The public names a package promises import, each in a fresh interpreter, where no submodule was imported before.

A package whose names load lazily (a module-level ``__getattr__``) is exercised the way a user meets it first: a bug
there hides in any process that already imported the submodule, as this suite's does. So each check runs in a new
interpreter, for every such module the package holds (found in the source, not listed by hand) and for every import
line of docs/python-api.md.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "aot"
API_PAGE = REPOSITORY / "docs" / "python-api.md"
DEPRECATED = {"aot.build"}  # warns on every name it forwards; tests/builder covers it


def _lazy_modules() -> list[str]:
    """Modules of aot with a module-level ``__getattr__``, dotted."""
    found = []
    for source in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body):
            parts = source.relative_to(REPOSITORY).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True, timeout=300)


LAZY = _lazy_modules()


def test_the_lazy_modules_are_found():
    assert {"aot.validate", "aot.builder", "aot.export"} <= set(LAZY), LAZY


@pytest.mark.parametrize("module", [name for name in LAZY if name not in DEPRECATED])
def test_each_public_name_imports_first_and_an_unknown_name_is_an_attribute_error(module):
    code = (
        f"import importlib\nmodule = importlib.import_module({module!r})\n"
        "names = list(getattr(module, '__all__', ()))\n"
        "for name in names:\n    getattr(module, name)\n"
        "try:\n    module.no_such_name\nexcept AttributeError as error:\n    print(len(names), 'names;', error)\n"
        "else:\n    raise SystemExit('an unknown name was answered')\n"
    )
    completed = _fresh(code)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "no_such_name" in completed.stdout, completed.stdout


def test_every_import_line_of_the_python_api_page_runs_in_a_fresh_interpreter():
    blocks = re.findall(r"```python\n(.*?)```", API_PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    imports = [line for block in blocks for line in block.splitlines() if re.match(r"(from aot[\w.]* import |import aot)", line)]
    assert len(imports) >= 5, imports  # precondition: the page still shows its imports
    for line in imports:  # one interpreter each: an import must not lean on one made before it
        completed = _fresh(line.split("#")[0])
        assert completed.returncode == 0, f"{line}: {completed.stderr[-2000:]}"


def test_the_api_pages_tracing_example_runs_as_written():
    """The page's second example traces and rewrites a model it makes itself: run verbatim, it must work (the first
    builds BERT-base; its names are held by the import tests above)."""
    blocks = re.findall(r"```python\n(.*?)```", API_PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 2 and "symbolic_trace(" in blocks[1], "precondition: the tracing example is the page's second block"
    names: dict = {}
    exec(compile(blocks[1], f"{API_PAGE}:tracing example", "exec"), names)
    import torch.fx

    assert isinstance(names["optimised"], torch.fx.GraphModule) and names["optimised"] is not names["bert"]
