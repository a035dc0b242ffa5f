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

from ._nodes import bypass
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten


@register_pass("remove_identity")
class RemoveIdentity(RewriteRule):
    """Removes nn.Identity calls and aliases that return their input unchanged."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        remove_detach: bool = Field(default=False, description="Also remove detach (fine for inference, not for training).")

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        if node.op == "call_module":
            return type(graph_module.get_submodule(str(node.target))) is nn.Identity
        if node.op == "call_function":
            return node.target is _aten.alias.default or (self.options.remove_detach and node.target in (_aten.detach.default, torch.detach))
        return node.op == "call_method" and node.target == "detach" and self.options.remove_detach

    def check(self, graph_module: GraphModule, node: Node) -> Match[tuple[Node, Node]]:
        """(the identity, its one operand)."""
        operands = list(node.args) + list(node.kwargs.values())
        if len(operands) != 1 or not isinstance(operands[0], Node):
            return Match.fail("unexpected arguments", node=node)
        return Match.ok((node, operands[0]))

    def rewrite(self, graph_module: GraphModule, identity: tuple[Node, Node]) -> None:
        bypass(graph_module, *identity)
