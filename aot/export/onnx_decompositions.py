"""Decompose only the nodes of an exported program that ONNX cannot take as they are.

``torch.onnx.export`` decomposes the program torch.export gives it before translating it:
ops with an ONNX translation are kept, the rest are rewritten with torch's decompositions.
It does so by tracing the whole program again through AOTAutograd, with symbolic shapes,
even when every node but one already has a translation. On BERT-base (AMD EPYC, one thread,
warm) that retrace took 2.4 s, and the whole export to the written file took 9.3 s with it
against 5.6 s without, on the build's critical path.

:func:`only_needed_decompositions` has the exporter decompose node by node instead:

- **Which nodes:** the ones torch.export's own rules would rewrite with the table
  torch.onnx builds: an op in that table, or a CompositeImplicitAutograd op that export
  cannot preserve (one that may alias, such as ``aten.reshape``, or ``aten.to``).
  Every other node is kept, as the retrace keeps it.
- **How:** each such node is traced alone with ``make_fx``, on its inputs' fake values
  (symbolic sizes included) and the same table, and the trace replaces the node::

      %to = aten.to.device(%attention_mask, cpu, torch.bool)
        ->  %_to_copy = aten._to_copy.default(%attention_mask, dtype=torch.bool, device=cpu)

      %reshape = aten.reshape.default(%linear, [%sym_size, %sym_size_1, 12, 64])
        ->  %view = aten.view.default(%linear, [%sym_size, %sym_size_1, 12, 64])

  So the ops reaching the translator are the ones the retrace gives, and BERT-base's ONNX
  graph is the retrace's up to the names of intermediate values. A replaced node that the
  program returns is renamed in its signature (torch's replace hook), which the translator
  reads the outputs by.
- **When not:** the retrace also functionalises the program. So any program that is not
  already functional goes the exporter's own way, and the reason is logged:
  - it mutates an input or a buffer;
  - it holds an op that mutates;
  - it holds a higher-order op (control flow, autocast regions);
  - a node cannot be traced alone, or its decomposition still holds ops that need
    decomposing, or that mutate.

The exporter has no option for this. So the context manager swaps the one function it
calls to decompose (``torch.onnx._internal.exporter._fx_passes.decompose_with_registry``)
for the duration of the export, and falls back to that function itself. torch is pinned
to 2.13 (pyproject.toml). Where a later torch moves the function, the exporter runs
unchanged and a warning says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import OutputKind

from aot.compat.torch_private import (
    OpOverload, Verifier, collect_all_valid_cia_ops, detect_fake_mode, is_cia_op, make_fx, onnx_exporter_passes, pytree,
)
from aot.errors import first_line

logger = logging.getLogger(__name__)

Table = dict[Any, Callable]


@contextlib.contextmanager
def only_needed_decompositions() -> Iterator[None]:
    """Inside, ``torch.onnx.export`` decomposes only the nodes that need it (see the module docstring)."""
    try:
        _decomp, _fx_passes = onnx_exporter_passes()

        whole_program = _fx_passes.decompose_with_registry
    except (ImportError, AttributeError):  # a torch whose exporter moved: export as it does
        logger.warning("torch.onnx has no _fx_passes.decompose_with_registry here: it decomposes the whole program")
        yield
        return

    def decompose(program: torch.export.ExportedProgram, registry: Any) -> torch.export.ExportedProgram:
        implemented = set(_decomp.get_onnx_implemented_overloads(registry))
        table = _decomp.create_onnx_friendly_decomposition_table(implemented)
        reason = decompose_where_needed(program, table)
        if reason is None:
            return program
        logger.info("ONNX export: the whole program is decomposed (%s)", reason)
        return whole_program(program, registry)

    _fx_passes.decompose_with_registry = decompose
    try:
        yield
    finally:
        _fx_passes.decompose_with_registry = whole_program


def decompose_where_needed(program: torch.export.ExportedProgram, table: Table) -> str | None:
    """Rewrite, in place, the nodes of ``program`` that ``table`` or export's rules decompose.

    Returns ``None`` when done, or, leaving ``program`` untouched, why only a whole-program
    retrace can decompose it.
    """
    reason = _not_functional(program)
    if reason is not None:
        return reason
    preserved = _preserved_composites(table)
    pending = [node for node in program.graph.nodes if _needs_decomposing(node, table, preserved)]
    traces = {}
    for node in pending:
        try:
            trace = _trace_decomposed(node, table)
        except Exception as error:  # noqa: BLE001 - the whole-program retrace may still manage it
            return f"node '{node.name}' ({node.target}) cannot be traced alone: {type(error).__name__}: {first_line(error)}"
        reason = _unfinished(trace, node, table, preserved)
        if reason is not None:
            return reason
        traces[node] = trace
    # torch's own hook renames a replaced output in the signature, which the translator reads outputs by.
    with program.graph_module._set_replace_hook(program.graph_signature.get_replace_hook()):
        for node, trace in traces.items():
            _replace(node, trace, [entry.signature for entry in program.module_call_graph if entry.signature])
    if traces:
        program.graph_module.recompile()
    logger.debug("ONNX export: decomposed %d node(s) one by one", len(traces))
    return None


def _not_functional(program: torch.export.ExportedProgram) -> str | None:
    mutated = [spec.arg.name for spec in program.graph_signature.output_specs if spec.kind != OutputKind.USER_OUTPUT]
    if mutated:
        return f"the program mutates {', '.join(mutated)}"
    for node in program.graph.nodes:
        reason = _not_functional_node(node)
        if reason is not None:
            return reason
    return None


def _not_functional_node(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    if isinstance(node.target, OpOverload):
        return f"node '{node.name}' mutates ({node.target})" if node.target._schema.is_mutable else None
    if node.target in _size_arithmetic():
        return None
    return f"node '{node.name}' calls {getattr(node.target, '__name__', node.target)}, which is no ATen op"


@functools.cache
def _size_arithmetic() -> frozenset:
    """The callables an exported program uses besides ATen ops, on sizes (and getitem): none has side effects."""
    symbolic = (torch.sym_int, torch.sym_float, torch.sym_ite, torch.sym_max, torch.sym_min, torch.sym_not)
    return frozenset((*Verifier().allowed_builtin_ops(), *symbolic, torch.sym_sqrt, torch.sym_sum))


def _preserved_composites(table: Table) -> set:
    """CompositeImplicitAutograd ops that torch.export keeps unless the table decomposes them."""
    return set(collect_all_valid_cia_ops()) - set(table)


def _needs_decomposing(node: torch.fx.Node, table: Table, preserved: set) -> bool:
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return False
    return node.target in table or (is_cia_op(node.target) and node.target not in preserved)


def _trace_decomposed(node: torch.fx.Node, table: Table) -> torch.fx.GraphModule:
    """``node`` alone, traced with ``table``: a graph whose placeholders are ``node``'s input nodes in order."""
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    is_input = [isinstance(arg, torch.fx.Node) for arg in flat]
    values = [arg.meta["val"] for arg in flat if isinstance(arg, torch.fx.Node)]

    def call(*inputs: Any) -> Any:
        given = iter(inputs)
        args, kwargs = pytree.tree_unflatten([next(given) if taken else arg for arg, taken in zip(flat, is_input)], spec)
        return node.target(*args, **kwargs)

    with detect_fake_mode(values) or contextlib.nullcontext():
        return make_fx(call, decomposition_table=table)(*values)


def _unfinished(trace: torch.fx.GraphModule, node: torch.fx.Node, table: Table, preserved: set) -> str | None:
    for traced in trace.graph.nodes:
        if _needs_decomposing(traced, table, preserved):
            return f"node '{node.name}' ({node.target}) decomposes into {traced.target}, which decomposes further"
        if _not_functional_node(traced) is not None:
            return f"node '{node.name}' ({node.target}) decomposes into {traced.target}, which is not functional"
    return None


def _replace(node: torch.fx.Node, trace: torch.fx.GraphModule, signatures: list) -> None:
    graph = node.graph
    placeholders = [traced for traced in trace.graph.nodes if traced.op == "placeholder"]
    inputs = [arg for arg in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(arg, torch.fx.Node)]
    before = set(graph.nodes)
    with graph.inserting_before(node):
        result = graph.graph_copy(trace.graph, dict(zip(placeholders, inputs, strict=True)))
    for inserted in (candidate for candidate in graph.nodes if candidate not in before):
        for key in _PROVENANCE:  # the ONNX node's name scope comes from the module that called the op
            if key in node.meta:
                inserted.meta.setdefault(key, node.meta[key])
    if isinstance(result, torch.fx.Node):
        _replace_uses(node, result, signatures)
    else:  # several outputs: the program reads each through getitem
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise AssertionError(f"'{user.name}' reads the outputs of '{node.name}' other than by index")
            _replace_uses(user, result[user.args[1]], signatures)
            graph.erase_node(user)
    graph.erase_node(node)


def _replace_uses(node: torch.fx.Node, replacement: torch.fx.Node, signatures: list) -> None:
    for signature in signatures:  # the module call graph names a module's outputs too
        signature.replace_all_uses_with(node, replacement)
    node.replace_all_uses_with(replacement)


_PROVENANCE = ("nn_module_stack", "stack_trace", "source_fn_stack", "torch_fn")
