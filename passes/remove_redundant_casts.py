"""RemoveRedundantCasts: drop conversions to the dtype and device a tensor already has.

Matches, when the input's recorded ``val`` already has the result's dtype and device::

    y = x.to(torch.float32)               # also x.float(), x.type(torch.float32), x.to("cpu"), ...
    y = aten.to.dtype(x, torch.float32)   # export frontend, also aten.to.dtype_layout / aten.to.device

Rewrites to::

    y = x

Math: ``Tensor.to`` and its shorthands return ``self`` when nothing changes, so
the result is the very same tensor.

Left alone: casts with ``copy=True`` or a ``memory_format``, ``aten._to_copy``
(always a copy), and nodes without a recorded ``val`` (dtype unknown).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ._nodes import tensor_val
from .base import Transformation
from .registry import register_pass

_aten = torch.ops.aten
_CAST_METHODS = {"to", "type", "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "byte", "char"}
_CAST_FUNCTIONS = (_aten.to.dtype, _aten.to.dtype_layout, _aten.to.device, _aten.to.other)


@register_pass("remove_redundant_casts")
class RemoveRedundantCasts(Transformation):
    """Removes dtype/device conversions that do not change the tensor."""

    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        for node in list(graph_module.graph.nodes):
            is_cast = (node.op == "call_method" and node.target in _CAST_METHODS) or (
                node.op == "call_function" and node.target in _CAST_FUNCTIONS
            )
            if not is_cast or not node.args or not isinstance(node.args[0], Node):
                continue
            self.report.matched += 1
            reason = _reason_to_keep(node)
            if reason:
                self.note(f"node '{node.name}': {reason}")
                continue
            node.replace_all_uses_with(node.args[0])
            graph_module.graph.erase_node(node)
            self.report.changed += 1
        return graph_module


def _reason_to_keep(node: Node) -> str | None:
    if node.kwargs.get("copy") or node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return "copy or memory_format requested"
    if node.op == "call_method" and node.target == "type" and len(node.args) + len(node.kwargs) == 1:
        return "x.type() returns a string"
    source, result = tensor_val(node.args[0]), tensor_val(node)
    if source is None or result is None:
        return "dtype unknown (no meta['val'])"
    if (source.dtype, source.device, source.layout) != (result.dtype, result.device, result.layout):
        return "it changes dtype, device or layout"
    return None
