"""ApproximateGelu: the exact (erf) GELU becomes its tanh approximation, an activation-function change.

Matches an exact GELU::

    y = F.gelu(x)                         # also F.gelu(x, approximate="none"), torch._C._nn.gelu
    y = aten.gelu.default(x)              # export frontend
    y = self.act(x)                       # an nn.GELU() module

Rewrites to::

    y = F.gelu(x, approximate="tanh")     # aten.gelu.default(x, approximate="tanh") on export

Math: ``gelu(x) = x·Φ(x) = x/2·(1 + erf(x/√2))`` becomes
``x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``. The two differ by at most about 3e-4
(near ``|x| ≈ 2``), so this pass does not preserve the computation: a recipe using it
must name an accuracy gate (``validate.accuracy``), which every artifact is then held to.
The tanh form is what fast GELU kernels compute (ONNX Runtime's FastGelu, oneDNN's
``gelu_tanh`` post-op).

Left alone, with a note: a GELU module with hooks, and a call whose ``approximate`` is
not a literal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ._modules import delete_if_unreferenced
from ._nodes import replace_with
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_GELU_FUNCTIONS = (F.gelu, _aten.gelu.default)


@register_pass("approximate_gelu")
class ApproximateGelu(RewriteRule):
    """Replaces the exact (erf) GELU by its tanh approximation (not computation-preserving)."""

    preserves_computation = False

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        if node.op == "call_function":
            return node.target in _GELU_FUNCTIONS
        return node.op == "call_module" and type(graph_module.get_submodule(str(node.target))) is torch.nn.GELU

    def check(self, graph_module: GraphModule, node: Node) -> Match[Node]:
        """An exact GELU whose form is known."""
        if node.op == "call_module":
            module = graph_module.get_submodule(str(node.target))
            if module._forward_hooks or module._forward_pre_hooks:
                return Match.fail("the GELU module has hooks", node=node)
            approximate = module.approximate
        else:
            approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        if not isinstance(approximate, str):
            return Match.fail("its `approximate` argument is computed, not a literal", node=node)
        if approximate != "none":
            return Match.fail(f"already the {approximate!r} approximation", node=node)
        return Match.ok(node)

    def rewrite(self, graph_module: GraphModule, node: Node) -> None:
        if node.op == "call_function":
            node.args = node.args[:1]
            node.kwargs = {**{k: v for k, v in node.kwargs.items() if k != "approximate"}, "approximate": "tanh"}
            return
        # A module may be shared with other call sites: this call changes, the module does not.
        with graph_module.graph.inserting_before(node):
            approximated = graph_module.graph.call_function(F.gelu, node.args[:1], {"approximate": "tanh"})
        approximated.meta.update(node.meta)
        replace_with(node, approximated)
        delete_if_unreferenced(graph_module, str(node.target))
