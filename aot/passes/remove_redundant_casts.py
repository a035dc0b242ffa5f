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

from ._nodes import replace_with, tensor_val
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_CAST_METHODS = {"to", "type", "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "byte", "char"}
_CAST_FUNCTIONS = (_aten.to.dtype, _aten.to.dtype_layout, _aten.to.device, _aten.to.other)


@register_pass("remove_redundant_casts")
class RemoveRedundantCasts(RewriteRule):
    """Removes dtype/device conversions that do not change the tensor."""

    preserves_computation = True

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        is_cast = (node.op == "call_method" and node.target in _CAST_METHODS) or (
            node.op == "call_function" and node.target in _CAST_FUNCTIONS
        )
        return is_cast and bool(node.args) and isinstance(node.args[0], Node)

    def check(self, graph_module: GraphModule, node: Node) -> Match[Node]:
        """A cast that returns its input unchanged."""
        if node.kwargs.get("copy") or node.kwargs.get("memory_format") not in (None, torch.preserve_format):
            return Match.fail("copy or memory_format requested", node=node)
        if node.op == "call_method" and node.target == "type" and len(node.args) + len(node.kwargs) == 1:
            return Match.fail("x.type() returns a string", node=node)
        source, result = tensor_val(node.args[0]), tensor_val(node)
        if source is None or result is None:
            return Match.fail("dtype unknown (no meta['val'])", node=node)
        if (source.dtype, source.device, source.layout) != (result.dtype, result.device, result.layout):
            return Match.fail("it changes dtype, device or layout", node=node)
        return Match.ok(node)

    def rewrite(self, graph_module: GraphModule, cast: Node) -> None:
        replace_with(cast, cast.args[0])
