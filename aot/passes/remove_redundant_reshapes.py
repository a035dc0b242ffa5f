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

from ._nodes import replace_with, tensor_val
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_SHAPE_METHODS = {"view", "reshape", "expand", "view_as", "reshape_as", "expand_as"}
_SHAPE_FUNCTIONS = (torch.reshape, _aten.view.default, _aten.reshape.default, _aten.expand.default, _aten._unsafe_view.default)
_RESHAPES = ({"reshape"}, (torch.reshape, _aten.reshape.default))


@register_pass("remove_redundant_reshapes")
class RemoveRedundantReshapes(RewriteRule):
    """Removes reshapes that keep the shape and collapses reshape chains."""

    preserves_computation = True

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        is_op = (node.op == "call_method" and node.target in _SHAPE_METHODS) or (
            node.op == "call_function" and node.target in _SHAPE_FUNCTIONS
        )
        return is_op and bool(node.args) and isinstance(node.args[0], Node)

    def check(self, graph_module: GraphModule, node: Node) -> Match[Node]:
        """The reshape to drop: ``node`` itself when it keeps the shape, else the reshape before it in a chain."""
        source, result = tensor_val(node.args[0]), tensor_val(node)
        if source is None or result is None:
            return Match.fail("shape unknown (no meta['val'])", node=node)
        if _same_shape(source.shape, result.shape):
            return Match.ok(node)
        inner = node.args[0]
        if _is_reshape(node) and _is_reshape(inner) and len(inner.users) == 1:
            return Match.ok(inner)
        return Match.fail("it changes the shape and does not follow a reshape only it reads", node=node)

    def rewrite(self, graph_module: GraphModule, reshape: Node) -> None:
        replace_with(reshape, reshape.args[0])


def _is_reshape(node) -> bool:
    return isinstance(node, Node) and (
        (node.op == "call_method" and node.target in _RESHAPES[0]) or (node.op == "call_function" and node.target in _RESHAPES[1])
    ) and bool(node.args) and isinstance(node.args[0], Node)


def _same_shape(left, right) -> bool:
    from aot.compat.torch_private import statically_known_true  # a second to import: only once a pass runs

    if len(left) != len(right):
        return False
    return all(a is b or statically_known_true(a == b) for a, b in zip(left, right))
