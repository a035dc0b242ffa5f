"""compose: chain transformations into one, linting and recompiling once.

``compose(a, b, c)`` applies ``a``, then ``b``, then ``c`` with
``lint_and_recompile=False`` and lints and recompiles once at the end. With
``inplace=False`` it first deep-copies the module, so the argument is left as it
was. The composition preserves computation only if every part does, and is a
``ReversibleTransformation`` only if every part is: its reverse undoes ``c``,
then ``b``, then ``a``. Its ``PassResult`` sums the counts of the parts, and its
notes name the part each comes from.
"""

from __future__ import annotations

from torch.fx import GraphModule

from .base import PassResult, ReversibleTransformation, Transformation, lint_and_recompile_graph
from .deep_copy import DeepCopy


class _Composition(Transformation):
    """Transformations applied in sequence."""

    def __init__(self, transformations: tuple[Transformation, ...], inplace: bool) -> None:
        super().__init__()
        self.transformations = transformations
        self.inplace = inplace
        self.preserves_computation = all(t.preserves_computation for t in transformations)
        self.name = f"compose({', '.join(t.name for t in transformations)})"

    def transform(self, graph_module: GraphModule) -> GraphModule:
        return self.apply(graph_module, lint_and_recompile=False).graph_module

    def apply(self, graph_module: GraphModule, lint_and_recompile: bool = True, reverse: bool = False) -> PassResult:
        if not self.inplace:
            graph_module = DeepCopy().apply(graph_module, lint_and_recompile=False).graph_module
        total = PassResult(graph_module, modified=False)
        for transformation in reversed(self.transformations) if reverse else self.transformations:
            if reverse:
                result = transformation.apply(total.graph_module, lint_and_recompile=False, reverse=True)
            else:
                result = transformation.apply(total.graph_module, lint_and_recompile=False)
            total.graph_module = result.graph_module
            total.modified |= result.modified
            total.matched += result.matched
            total.changed += result.changed
            total.notes += [f"{transformation.name}: {note}" for note in result.notes]
        if lint_and_recompile:
            lint_and_recompile_graph(total.graph_module, self.name)
        return total

    def __repr__(self) -> str:
        return f"compose({', '.join(map(repr, self.transformations))}, inplace={self.inplace})"


class _ReversibleComposition(_Composition, ReversibleTransformation):
    """Reversible transformations applied in sequence; reversed in the opposite order."""

    def __call__(self, graph_module: GraphModule, lint_and_recompile: bool = True, reverse: bool = False) -> GraphModule:
        return self.apply(graph_module, lint_and_recompile=lint_and_recompile, reverse=reverse).graph_module

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        return self.apply(graph_module, lint_and_recompile=False, reverse=True).graph_module

    def get_transformed_nodes(self, graph_module: GraphModule):
        return [node for node in graph_module.graph.nodes if any(t.transformed(node) for t in self.transformations)]


def compose(*transformations: Transformation, inplace: bool = True) -> Transformation:
    """Composes ``transformations`` into one transformation applied in order."""
    if not transformations:
        raise ValueError("compose needs at least one transformation")
    for transformation in transformations:
        if not isinstance(transformation, Transformation):
            raise TypeError(f"compose takes Transformation instances, got {type(transformation).__name__}")
    reversible = all(isinstance(t, ReversibleTransformation) for t in transformations)
    return (_ReversibleComposition if reversible else _Composition)(tuple(transformations), inplace)
