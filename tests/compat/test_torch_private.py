"""Private torch names: all behind aot.compat.torch_private, each resolving on the installed torch, with fallbacks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from aot.compat import torch_private

REPO = Path(__file__).resolve().parents[2]
# The saved module.py pastes these in: they must import torch alone, so they name their own ops.
ARTIFACT_RUNTIME = {REPO / "aot" / "runtime", REPO / "aot" / "tracing" / "torch_functions.py", REPO / "aot" / "compat",
                    REPO / "aot" / "export" / "aoti_child.py"}  # torch alone, as a deployment loads the AOTInductor package


@pytest.mark.parametrize("name", sorted(torch_private._NAMES))
def test_every_private_name_resolves_on_the_installed_torch(name):
    assert getattr(torch_private, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        torch_private.nothing_here


def _private_uses(path: Path) -> list[str]:
    """``torch._x`` / ``torch.a._b`` attribute chains and imports in ``path``'s code (not its strings or comments)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            found += [f"{path.name}:{node.lineno}: from {node.module} import ..." for name in names[:1]
                      if any(part.startswith("_") for name in names for part in name.split("."))]
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("torch") and any(part.startswith("_") for part in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "torch" and chain[-1] not in ("ops",) and "_check" != node.attr:
                found.append(f"{path.name}:{node.lineno}: torch.{'.'.join(reversed(chain))}")
    return found


def test_no_module_outside_the_compat_layer_names_a_private_torch_name():
    sources = [path for folder in ("aot", "export", "passes") for path in (REPO / folder).rglob("*.py")
               if not any(path.is_relative_to(allowed) for allowed in ARTIFACT_RUNTIME)]
    assert len(sources) > 50, "the precondition: the package's sources were found"
    assert _private_uses(REPO / "aot" / "runtime" / "int8_linear.py"), "the precondition: the scan sees torch._int_mm there"
    assert "_fx_passes" in (REPO / "aot" / "export" / "onnx_decompositions.py").read_text(), "the precondition: names in docstrings"
    found = [use for path in sources for use in _private_uses(path)]
    assert found == [], "import these through aot.compat.torch_private:\n" + "\n".join(found)


def test_stack_traces_are_switched_off_inside_and_restored_after():
    config = torch.fx.config
    if not hasattr(config, "do_not_emit_stack_traces"):
        pytest.skip(f"torch {torch.__version__} has no do_not_emit_stack_traces: the fallback test below covers it")
    before = config.do_not_emit_stack_traces
    with torch_private.fx_code_without_stack_traces():
        assert config.do_not_emit_stack_traces is True
    assert config.do_not_emit_stack_traces == before


def test_a_torch_without_the_stack_trace_switch_sets_nothing(monkeypatch):
    import types

    config_of_2_11 = types.SimpleNamespace()  # torch 2.11's torch.fx.config has no such switch
    monkeypatch.setattr(torch.fx, "config", config_of_2_11)
    with torch_private.fx_code_without_stack_traces():
        assert vars(config_of_2_11) == {}
    assert vars(config_of_2_11) == {}


def test_copy_on_write_probe_sees_a_lazy_clone():
    tensor = torch.randn(4)
    assert not torch_private.is_cow_tensor(tensor)
    clone = torch_private.lazy_clone(tensor)
    assert torch_private.is_cow_tensor(clone) and torch.equal(clone, tensor)
