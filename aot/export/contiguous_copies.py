"""Explicit copies for ``contiguous()`` before the ONNX exporter, which can lose them.

Why: torch.onnx's decomposition step (torch 2.13) reasons about sizes "obliviously"
(``backed_size_oblivious``). In Swin's attention, with a dynamic batch, it took
``transpose(1, 2).contiguous()`` for the transposed tensor itself, turned the ``reshape``
after it into a view, and then refused that view::

    Cannot view a tensor with shape torch.Size([4*s99, 16, 2, 8]) and strides
    (256, 8, 128, 1) as a tensor with shape (4*s99, 16, 16)!

``clone(memory_format=torch.contiguous_format)`` copies whatever the strides, so nothing
can drop it, and it computes the same values (ONNX has no strides at all). Only a
``contiguous()`` whose every reader is a reshape or view is replaced: ``contiguous()`` may
return its input itself, and a reader writing in place would then also write into the
input, which a copy would not.

The graph handed in is left as it is: the copies go into a new graph over the same modules.
"""

from __future__ import annotations

import copy

import torch
import torch.fx

_aten = torch.ops.aten
_RESHAPING_METHODS = frozenset({"view", "reshape"})
_RESHAPING_FUNCTIONS = frozenset({torch.reshape, _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default})


def with_explicit_copies(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or a GraphModule sharing its modules whose reshaped ``contiguous()`` calls are copies."""
    if not reshaped_contiguous_calls(gm):
        return gm
    graph = copy.deepcopy(gm.graph)
    for node in list(graph.nodes):
        if not _replaceable(node):
            continue
        source = node.args[0]
        with graph.inserting_before(node):
            if node.op == "call_method":
                copied = graph.call_method("clone", (source,), {"memory_format": torch.contiguous_format})
            else:
                copied = graph.call_function(_aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
        copied.meta = dict(node.meta)
        node.replace_all_uses_with(copied)
        graph.erase_node(node)
    copied_gm = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    copied_gm.meta = gm.meta
    return copied_gm


def reshaped_contiguous_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ``contiguous()`` calls :func:`with_explicit_copies` makes copies of: those whose every reader reshapes."""
    return [node for node in gm.graph.nodes if _replaceable(node)]


def _replaceable(node: torch.fx.Node) -> bool:
    plain = len(node.args) == 1 and (not node.kwargs or node.kwargs == {"memory_format": torch.contiguous_format})
    is_contiguous = (node.op == "call_method" and node.target == "contiguous") or (
        node.op == "call_function" and node.target is _aten.contiguous.default
    )
    return is_contiguous and plain and bool(node.users) and all(_reshapes(user) for user in node.users)


def _reshapes(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _RESHAPING_METHODS
    return node.op == "call_function" and node.target in _RESHAPING_FUNCTIONS
