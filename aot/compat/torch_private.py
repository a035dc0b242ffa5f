"""Every private torch name aot uses outside the saved artifact, in one place, with a fallback per version.

torch's private names (a leading underscore, or a module under ``torch._*``) move without notice.
aot's own code imports them from here, never from torch: a move is fixed in this table, and the
canary (``scripts/canary.py``) runs the suite on the newest release to find it.

Tested window: torch 2.11 to 2.15 (pyproject). What each release lacks, and what stands in:

- ``torch.fx.config.do_not_emit_stack_traces`` (in 2.13, not in 2.11): :func:`fx_code_without_stack_traces`
  sets it where it exists; on 2.11 the export records every node's stack trace (about a second of
  BERT-base's export), which the ONNX file drops anyway.
- ``torch.onnx._internal.exporter._fx_passes.decompose_with_registry``: read by
  :mod:`aot.export.onnx_decompositions`, which falls back to torch.onnx's own retrace with a warning.

Names resolve on first use (PEP 562 ``__getattr__``), so importing this module imports nothing
heavy: ``aot check`` runs without torch.

Not here, on purpose: what the saved ``module.py`` carries must import torch alone, so it names its
ops itself: the runtime kernels (``aot/runtime/``: ``torch._int_mm``, ``torch.ops.mkldnn._linear_pointwise``...,
each falling back to plain float ops where an op is missing) and the tracer's leaf functions
(``aot/tracing/torch_functions.py``: ``torch._check_with``, in every release of the window), and the process
that proves an AOTInductor package loads with torch alone (``export/aoti_child.py``: ``torch._inductor.aoti_load_package``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

# {name here: (module, attribute)}: the private names, each read once from its module.
_NAMES: dict[str, tuple[str, str]] = {
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    "unset_fake_temporarily": ("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    "DataDependentOutputException": ("torch._subclasses.fake_tensor", "DataDependentOutputException"),
    "DynamicOutputShapeException": ("torch._subclasses.fake_tensor", "DynamicOutputShapeException"),
    "detect_fake_mode": ("torch._guards", "detect_fake_mode"),
    "GuardOnDataDependentSymNode": ("torch.fx.experimental.symbolic_shapes", "GuardOnDataDependentSymNode"),
    "ShapeEnv": ("torch.fx.experimental.symbolic_shapes", "ShapeEnv"),
    "statically_known_true": ("torch.fx.experimental.symbolic_shapes", "statically_known_true"),
    "FakeTensorProp": ("torch.fx.passes.fake_tensor_prop", "FakeTensorProp"),
    "make_fx": ("torch.fx.experimental.proxy_tensor", "make_fx"),
    "is_fx_symbolic_tracing": ("torch.fx._symbolic_trace", "is_fx_symbolic_tracing"),
    "OpOverload": ("torch._ops", "OpOverload"),
    "OpOverloadPacket": ("torch._ops", "OpOverloadPacket"),
    "HigherOrderOperator": ("torch._ops", "HigherOrderOperator"),
    "pytree": ("torch.utils", "_pytree"),
    "Verifier": ("torch._export.verifier", "Verifier"),
    "collect_all_valid_cia_ops": ("torch._export.utils", "_collect_all_valid_cia_ops"),
    "is_cia_op": ("torch._export.utils", "_is_cia_op"),
    "lazy_clone": ("torch", "_lazy_clone"),
    "inductor_config": ("torch._inductor", "config"),
    # AOTInductor's documented entry points, under a private module's name (export.aoti_package, the bench's runner)
    "aoti_compile_and_package": ("torch._inductor", "aoti_compile_and_package"),
    "aoti_load_package": ("torch._inductor", "aoti_load_package"),
    "PyTreeCodeGen": ("torch.fx.graph", "_PyTreeCodeGen"),
    "PyTreeInfo": ("torch.fx.graph", "_PyTreeInfo"),
    "get_qualified_name": ("torch.fx.node", "_get_qualified_name"),
}

# Modules named by string: the export child's imports made ahead (aot.builder.spine), the onnx registration logger,
# and the class torch.export's unlifting puts into a module (export.module_tree).
EXPORT_STACK_MODULES = ("torch.export._trace", "torch._functorch.aot_autograd", "torch.onnx._internal.exporter._core")
ONNX_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"
UNLIFTED_GUARDS_CLASS = "torch.export._unlift.GuardsFn"


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _NAMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    imported = importlib.import_module(module)
    # A submodule (torch.utils._pytree, torch._inductor.config) is an attribute only once imported.
    value = getattr(imported, attribute) if hasattr(imported, attribute) else importlib.import_module(f"{module}.{attribute}")
    globals()[name] = value
    return value


def is_cow_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a lazy copy-on-write clone (``torch._C._is_cow_tensor``; False where torch has none)."""
    import torch

    probe = getattr(torch._C, "_is_cow_tensor", None)
    return bool(probe(tensor)) if probe is not None else False


def onnx_exporter_passes() -> tuple[Any, Any]:
    """torch.onnx's ``_decomp`` and ``_fx_passes`` modules (ImportError where a release moved them)."""
    from torch.onnx._internal.exporter import _decomp, _fx_passes

    return _decomp, _fx_passes


@contextlib.contextmanager
def fx_code_without_stack_traces() -> Iterator[None]:
    """torch.export records no Python stack trace per node inside (``torch.fx.config.do_not_emit_stack_traces``)."""
    import torch.fx

    config = getattr(torch.fx, "config", None)
    if config is None or not hasattr(config, "do_not_emit_stack_traces"):
        yield  # torch 2.11: no such switch; the traces are recorded, and the ONNX file drops them
        return
    previous = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = previous
