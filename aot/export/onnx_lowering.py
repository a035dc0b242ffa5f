"""The ONNX unit's own lowering passes: named, in the order they run, run by one loop, recorded in the manifest.

:func:`aot.export.onnx_export.write_onnx` lowers twice. Before ``torch.onnx.export``, on the GraphModule (form
``fx``: each pass copies what it changes, so the graph handed in stays as the other artifacts need it); after it, on
the ``onnx_ir`` model the exporter made (form ``onnx``: in place, before ONNX Runtime's fusions, the float16
conversion and the write)::

    fx    with_explicit_copies       reshaped contiguous() as clone: the exporter's decomposition may lose it
    fx    lower_int8_linears         Int8DynamicLinear calls as custom ops translated to ONNX's int8 ops
    fx    lower_weight_only_linears  WeightOnlyLinear calls as aot::weight_only_linear, translated to MatMulNBits
    onnx  shift_int8_codes_on_write  int8 weight-only codes stored as MatMulNBits reads them, q + 128, as written
    onnx  declare_contrib_domain     com.microsoft among the opset imports where only If branches use it
    onnx  rename_inputs              the ONNX names that are no Python identifiers (a decoder's past_key_values.0.key)

Each pass lives with what it lowers (:mod:`aot.export.contiguous_copies`, :mod:`aot.export.onnx_int8`,
:mod:`aot.export.onnx_weight_only`); this module binds each to its name and form, as :mod:`aot.export.onnx_rules`
does for the rewrite rules. The exporter's translations of the custom ops the ``fx`` passes put in are handed on in
the :class:`LoweringContext`.

What each did goes into the manifest's ``onnx_lowering``, one entry a pass, in order: ``changed`` is the pass's own
count (calls lowered, copies made, codes shifted, inputs renamed), ``modified`` is computed by comparing what the
pass was given with what it left (for ``onnx``: nodes, initializers' tensors, input names, opset imports), never
assumed. A pass that found nothing to lower is listed too, unmodified: the record says what ran.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import onnx_ir as ir
import torch

from aot.errors import AotError, ExportError, first_line
from aot.passes.base import graph_fingerprint

from .contiguous_copies import reshaped_contiguous_calls, with_explicit_copies
from .onnx_int8 import int8_linear_calls, lower_int8_linears
from .onnx_weight_only import declare_contrib_domain, lower_weight_only_linears, shift_int8_codes_on_write, weight_only_calls

Form = Literal["fx", "onnx"]


@dataclass
class LoweringContext:
    """What the passes take beside the graph, and what the ``fx`` passes hand the exporter."""

    int8_prompts: bool = False  # int4 layers' prompt rows through ONNX Runtime's int8 GEMM (aot.export.onnx_prompt_gemm)
    input_names: Mapping[str, str] = field(default_factory=dict)  # {graph input: ONNX name} where they differ
    translations: dict[Any, Callable[..., Any]] = field(default_factory=dict)  # {custom op: its onnxscript translation}


@dataclass(frozen=True)
class OnnxLoweringPass:
    name: str
    form: Form
    lower: Callable[[Any, LoweringContext], tuple[Any, int]]  # (graph or model, context) -> (what it left, sites changed)

    @property
    def summary(self) -> str:
        return (self.lower.__doc__ or "").strip().splitlines()[0]


@dataclass(frozen=True)
class LoweringRecord:
    name: str
    form: Form
    modified: bool
    changed: int

    def to_json(self) -> dict[str, Any]:
        return {"pass": self.name, "form": self.form, "modified": self.modified, "changed": self.changed}


def _with_explicit_copies(graph_module: torch.fx.GraphModule, context: LoweringContext) -> tuple[torch.fx.GraphModule, int]:
    """Each contiguous() whose readers all reshape becomes a clone, which the exporter cannot drop."""
    return with_explicit_copies(graph_module), len(reshaped_contiguous_calls(graph_module))


def _lower_int8_linears(graph_module: torch.fx.GraphModule, context: LoweringContext) -> tuple[torch.fx.GraphModule, int]:
    """Each Int8DynamicLinear call becomes a custom op that the exporter translates to ONNX's int8 ops."""
    lowered, translations = lower_int8_linears(graph_module)
    context.translations.update(translations)
    return lowered, len(int8_linear_calls(graph_module))


def _lower_weight_only_linears(graph_module: torch.fx.GraphModule, context: LoweringContext) -> tuple[torch.fx.GraphModule, int]:
    """Each WeightOnlyLinear call becomes aot::weight_only_linear, which the exporter translates to MatMulNBits."""
    lowered, translations = lower_weight_only_linears(graph_module, int8_prompts=context.int8_prompts)
    context.translations.update(translations)
    return lowered, len(weight_only_calls(graph_module))


def _shift_int8_codes_on_write(model: ir.Model, context: LoweringContext) -> tuple[ir.Model, int]:
    """Each 8-bit MatMulNBits' int8 codes are stored as it reads them, q + 128 in uint8, each made as it is written."""
    return model, shift_int8_codes_on_write(model)


def _declare_contrib_domain(model: ir.Model, context: LoweringContext) -> tuple[ir.Model, int]:
    """com.microsoft is declared among the opset imports where only nodes in If branches use it."""
    return model, declare_contrib_domain(model)


def _rename_inputs(model: ir.Model, context: LoweringContext) -> tuple[ir.Model, int]:
    """Inputs take their ONNX names where these are no Python identifiers (a decoder's past_key_values.0.key)."""
    renamed = 0
    for value in model.graph.inputs:
        if value.name in context.input_names:
            value.name = context.input_names[value.name]
            renamed += 1
    return model, renamed


def _registry(*passes: OnnxLoweringPass) -> Mapping[str, OnnxLoweringPass]:
    by_name: dict[str, OnnxLoweringPass] = {}
    for lowering in passes:
        if not lowering.name.isidentifier() or lowering.name != lowering.name.lower():
            raise ValueError(f"ONNX lowering pass name '{lowering.name}' must be a snake_case identifier")
        if lowering.name in by_name:
            raise ValueError(f"two ONNX lowering passes are registered as {lowering.name!r}")
        by_name[lowering.name] = lowering
    return types.MappingProxyType(by_name)


ONNX_LOWERING = _registry(
    OnnxLoweringPass("with_explicit_copies", "fx", _with_explicit_copies),
    OnnxLoweringPass("lower_int8_linears", "fx", _lower_int8_linears),
    OnnxLoweringPass("lower_weight_only_linears", "fx", _lower_weight_only_linears),
    OnnxLoweringPass("shift_int8_codes_on_write", "onnx", _shift_int8_codes_on_write),
    OnnxLoweringPass("declare_contrib_domain", "onnx", _declare_contrib_domain),
    OnnxLoweringPass("rename_inputs", "onnx", _rename_inputs),
)
"""Every lowering pass by name, in the order they run (each form's passes in the order listed)."""


def run_lowering(form: Form, subject: Any, context: LoweringContext) -> tuple[Any, list[LoweringRecord]]:
    """Run the ``form`` passes on ``subject`` (a GraphModule for ``fx``, an ``onnx_ir.Model`` for ``onnx``), in order;
    what the last left, and a record of each. A pass that fails is an ExportError naming it."""
    fingerprint = graph_fingerprint if form == "fx" else _model_fingerprint
    records = []
    for lowering in ONNX_LOWERING.values():
        if lowering.form != form:
            continue
        before = fingerprint(subject)
        try:
            lowered, changed = lowering.lower(subject, context)
        except AotError:
            raise
        except Exception as error:  # a bug or an unsupported layer: one line naming the pass
            raise ExportError(f"ONNX lowering pass '{lowering.name}' failed: {type(error).__name__}: {first_line(error)}") from error
        modified = lowered is not subject or fingerprint(lowered) != before
        records.append(LoweringRecord(lowering.name, form, modified, changed))
        subject = lowered
    return subject, records


def _model_fingerprint(model: ir.Model) -> tuple:
    """What an ``onnx`` pass may change: the nodes (and what they read), the initializers' tensors and types, the
    inputs' names, the opset imports. Tensors by identity: a pass replaces a tensor, it never writes into one."""
    nodes = tuple((node.domain, node.op_type, tuple(map(id, node.inputs))) for node in ir.traversal.RecursiveGraphIterator(model.graph))
    initializers = tuple((name, id(value.const_value), value.dtype) for name, value in model.graph.initializers.items())
    return nodes, initializers, tuple(value.name for value in model.graph.inputs), tuple(model.opset_imports.items())
