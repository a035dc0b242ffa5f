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

from ._modules import delete_if_unreferenced
from ._nodes import argument, replace_with
from .base import Transformation
from .registry import register_pass

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
class RemoveDropout(Transformation):
    """Removes dropout that is a no-op: eval mode or p = 0."""

    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        removed_modules = set()
        for node in list(graph_module.graph.nodes):
            reason = self._reason_to_keep(graph_module, node)
            if reason is None:
                continue
            self.report.matched += 1
            if reason:
                self.note(f"node '{node.name}': {reason}")
                continue
            input_node = node.args[0] if node.args else next(iter(node.kwargs.values()))
            replace_with(node, input_node)
            if node.op == "call_module":
                removed_modules.add(str(node.target))
            self.report.changed += 1
        for target in removed_modules:
            delete_if_unreferenced(graph_module, target)
        return graph_module

    def _reason_to_keep(self, graph_module: GraphModule, node: Node) -> str | None:
        """None: not a dropout; "": a no-op dropout; otherwise why it must stay."""
        if node.op == "call_module":
            module = graph_module.get_submodule(str(node.target))
            if not isinstance(module, _DROPOUT_MODULES):
                return None
            if module.training and module.p > 0:
                return "in training mode"
            return "" if len(node.args) + len(node.kwargs) == 1 else "unexpected arguments"
        if node.op != "call_function" or node.target not in _DROPOUT_FUNCTIONS:
            return None
        index, keyword, default = _DROPOUT_FUNCTIONS[node.target]
        p = argument(node, 1, "p", 0.5)
        training = argument(node, index, keyword, default)
        if isinstance(p, (int, float)) and p == 0:
            return ""
        if training is False:
            return ""
        return "in training mode" if training is not None else "training flag not known"
