"""RemoveIdentity: drop operations that return their input unchanged.

Matches::

    y = self.identity(x)             # nn.Identity module
    y = aten.alias.default(x)        # export frontend
    y = aten.detach.default(x)       # also x.detach(): only with remove_detach

Rewrites to::

    y = x

Math: the identity. ``detach`` only cuts autograd history: removing it changes
nothing for inference, but would let gradients through, so it is opt-in.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.fx import GraphModule, Node

from ._modules import delete_if_unreferenced
from ._nodes import replace_with
from .base import Transformation
from .registry import register_pass

_aten = torch.ops.aten


@register_pass("remove_identity")
class RemoveIdentity(Transformation):
    """Removes nn.Identity calls and aliases that return their input unchanged."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        remove_detach: bool = Field(default=False, description="Also remove detach (fine for inference, not for training).")

    def transform(self, graph_module: GraphModule) -> GraphModule:
        removed_modules = set()
        for node in list(graph_module.graph.nodes):
            if not self._is_identity(graph_module, node):
                continue
            self.report.matched += 1
            operands = list(node.args) + list(node.kwargs.values())
            if len(operands) != 1 or not isinstance(operands[0], Node):
                self.note(f"node '{node.name}': unexpected arguments")
                continue
            replace_with(node, operands[0])
            if node.op == "call_module":
                removed_modules.add(str(node.target))
            self.report.changed += 1
        for target in removed_modules:
            delete_if_unreferenced(graph_module, target)
        return graph_module

    def _is_identity(self, graph_module: GraphModule, node: Node) -> bool:
        if node.op == "call_module":
            return type(graph_module.get_submodule(str(node.target))) is nn.Identity
        if node.op == "call_function":
            return node.target is _aten.alias.default or (self.options.remove_detach and node.target in (_aten.detach.default, torch.detach))
        return node.op == "call_method" and node.target == "detach" and self.options.remove_detach
