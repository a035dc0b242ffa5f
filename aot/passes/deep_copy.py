"""DeepCopy: a deep copy of the graph module, node metadata included.

Graph and code are unchanged (``modified`` is False); the copy owns all its
modules and tensors, so later in-place passes cannot reach the original. Marks
and reverse data live in ``node.meta`` and are copied with it, so the copy can
still be reversed. Its reverse is another copy.
"""

from __future__ import annotations

import copy

from torch.fx import GraphModule

from .base import REVERSE_KEY, TRANSFORMS_KEY, PassResult, ReversibleTransformation
from .registry import register_pass


@register_pass("deep_copy")
class DeepCopy(ReversibleTransformation):
    """Makes a deep copy of the graph module."""

    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        clone = copy.deepcopy(graph_module)
        # GraphModule's deepcopy copies node.meta shallowly (FakeTensors cannot be deep-copied);
        # the marks are mutable JSON values, so they get their own copy.
        for original, copied in zip(graph_module.graph.nodes, clone.graph.nodes):
            copied.meta = dict(copied.meta)
            for key in (TRANSFORMS_KEY, REVERSE_KEY):
                if key in original.meta:
                    copied.meta[key] = copy.deepcopy(original.meta[key])
        return clone

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        return self.transform(graph_module)

    def apply(self, graph_module: GraphModule, lint_and_recompile: bool = True, reverse: bool = False) -> PassResult:
        result = super().apply(graph_module, lint_and_recompile=lint_and_recompile, reverse=reverse)
        result.modified = False  # a new object, but the same graph and the same values
        return result
