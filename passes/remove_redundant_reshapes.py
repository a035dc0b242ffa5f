"""RemoveRedundantReshapes: drop reshapes to the shape a tensor already has, and collapse chains.

Matches::

    y = x.view(s)          # with s == x.shape; also reshape, expand, view_as, reshape_as, expand_as,
                           # torch.reshape and aten.view / aten.reshape / aten.expand / aten._unsafe_view
    z = y.reshape(t)       # y = x.reshape(s) read by nothing else

Rewrites to::

    y = x                  # same shape: the same elements, the same strides
    z = x.reshape(t)       # reshape keeps row-major order, so the middle step is moot

Math: a view to the same shape has the same strides, so it is the same tensor;
``reshape(reshape(x, s), t)`` and ``reshape(x, t)`` list the elements of ``x`` in the
same row-major order.

Shapes come from the nodes' recorded ``val`` and must be equal for every input
(symbolic sizes are compared without guessing). Nodes without ``val`` are left alone.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ._nodes import tensor_val
from .base import Transformation
from .registry import register_pass

_aten = torch.ops.aten
_SHAPE_METHODS = {"view", "reshape", "expand", "view_as", "reshape_as", "expand_as"}
_SHAPE_FUNCTIONS = (torch.reshape, _aten.view.default, _aten.reshape.default, _aten.expand.default, _aten._unsafe_view.default)
_RESHAPES = ({"reshape"}, (torch.reshape, _aten.reshape.default))


@register_pass("remove_redundant_reshapes")
class RemoveRedundantReshapes(Transformation):
    """Removes reshapes that keep the shape and collapses reshape chains."""

    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        for node in list(graph_module.graph.nodes):
            if not _is_shape_op(node):
                continue
            self.report.matched += 1
            source, result = tensor_val(node.args[0]), tensor_val(node)
            if source is None or result is None:
                self.note(f"node '{node.name}': shape unknown (no meta['val'])")
                continue
            if _same_shape(source.shape, result.shape):
                node.replace_all_uses_with(node.args[0])
                graph_module.graph.erase_node(node)
                self.report.changed += 1
                continue
            inner = node.args[0]
            if _is_reshape(node) and _is_reshape(inner) and len(inner.users) == 1:
                node.replace_input_with(inner, inner.args[0])
                graph_module.graph.erase_node(inner)
                self.report.changed += 1
        return graph_module


def _is_shape_op(node: Node) -> bool:
    is_op = (node.op == "call_method" and node.target in _SHAPE_METHODS) or (
        node.op == "call_function" and node.target in _SHAPE_FUNCTIONS
    )
    return is_op and bool(node.args) and isinstance(node.args[0], Node)


def _is_reshape(node) -> bool:
    return isinstance(node, Node) and (
        (node.op == "call_method" and node.target in _RESHAPES[0]) or (node.op == "call_function" and node.target in _RESHAPES[1])
    ) and bool(node.args) and isinstance(node.args[0], Node)


def _same_shape(left, right) -> bool:
    if len(left) != len(right):
        return False
    return all(a is b or statically_known_true(a == b) for a, b in zip(left, right))
