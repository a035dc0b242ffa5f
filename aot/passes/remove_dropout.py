"""RemoveDropout: drop dropout that does nothing, i.e. in eval mode or with p = 0.

Matches::

    y = self.dropout(x)                                   # nn.Dropout* module, not training
    y = torch.nn.functional.dropout(x, p, training=False) # also p == 0
    y = aten.dropout.default(x, p, False)                 # export frontend

Rewrites to::

    y = x                                                 # uses of y read x

Math: in eval mode (or with ``p = 0``) dropout returns its input unchanged.

Left alone: dropout in training mode with ``p > 0`` (it is random), and
``F.dropout`` called without ``training=`` (its default is ``training=True``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._nodes import argument, bypass
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_F = torch.nn.functional
_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
# function -> index of its "training" argument and its keyword name and default
_DROPOUT_FUNCTIONS = {
    _F.dropout: (2, "training", True),
    _F.dropout1d: (2, "training", True),
    _F.dropout2d: (2, "training", True),
    _F.dropout3d: (2, "training", True),
    _F.alpha_dropout: (2, "training", False),
    _F.feature_alpha_dropout: (2, "training", False),
    torch.dropout: (2, "train", None),
    _aten.dropout.default: (2, "train", None),
    _aten.feature_dropout.default: (2, "train", None),
    _aten.alpha_dropout.default: (2, "train", None),
}


@register_pass("remove_dropout")
class RemoveDropout(RewriteRule):
    """Removes dropout that is a no-op: eval mode or p = 0."""

    preserves_computation = True

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        if node.op == "call_module":
            return isinstance(graph_module.get_submodule(str(node.target)), _DROPOUT_MODULES)
        return node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS

    def check(self, graph_module: GraphModule, node: Node) -> Match[tuple[Node, Node]]:
        """A dropout that returns its input: (the dropout, its input)."""
        if node.op == "call_module":
            module = graph_module.get_submodule(str(node.target))
            if module.training and module.p > 0:
                return Match.fail("in training mode", node=node)
            if len(node.args) + len(node.kwargs) != 1:
                return Match.fail("unexpected arguments", node=node)
        else:
            index, keyword, default = _DROPOUT_FUNCTIONS[node.target]
            p = argument(node, 1, "p", 0.5)
            training = argument(node, index, keyword, default)
            if not (isinstance(p, (int, float)) and p == 0) and training is not False:
                return Match.fail("in training mode" if training is not None else "training flag not known", node=node)
        return Match.ok((node, node.args[0] if node.args else next(iter(node.kwargs.values()))))

    def rewrite(self, graph_module: GraphModule, dropout: tuple[Node, Node]) -> None:
        bypass(graph_module, *dropout)
