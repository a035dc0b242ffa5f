"""LintAndRecompile: check the graph and regenerate its Python code.

No rewrite: ``graph.lint()`` checks the graph is well formed (a failure names this
pass in a PassError) and ``recompile()`` regenerates ``forward``. ``compose`` uses it
once at the end instead of after every pass. ``modified`` is False.
"""

from __future__ import annotations

from torch.fx import GraphModule

from .base import ReversibleTransformation, lint_and_recompile_graph
from .registry import register_pass


@register_pass("lint_and_recompile")
class LintAndRecompile(ReversibleTransformation):
    """Lints and recompiles the graph module."""

    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        lint_and_recompile_graph(graph_module, self.name)
        return graph_module

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        return self.transform(graph_module)
