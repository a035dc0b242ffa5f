"""DeadCodeElimination: remove nodes whose results nothing reads, then the weights only they read.

Matches::

    unused = self.layer(x)        # no users, no side effects
    t = self.table                # get_attr that nothing reads any more

Rewrites to: nothing. Then submodules, parameters and buffers that no node
reaches are deleted from the graph module (never from the caller's model),
which shrinks what is saved.

Math: none to do. A node that no output depends on and that has no side
effect cannot change what the module returns.

Kept: placeholders, the output, and impure nodes (in-place ops, asserts,
``torch.export``'s ``_guards_fn`` and anything ``Node.is_impure`` reports).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from torch.fx import GraphModule

from ._modules import delete_attribute, referenced_targets
from .base import Transformation
from .registry import register_pass


@register_pass("dead_code_elimination")
class DeadCodeElimination(Transformation):
    """Removes unused nodes and the submodules and tensors only they used."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        remove_unused_attributes: bool = Field(
            default=True, description="Also delete submodules, parameters and buffers that no node reads."
        )

    def transform(self, graph_module: GraphModule) -> GraphModule:
        graph = graph_module.graph
        changed = True
        while changed:
            changed = False
            for node in reversed(list(graph.nodes)):
                if node.op in ("placeholder", "output") or node.users or node.is_impure():
                    continue
                graph.erase_node(node)
                self.report.changed += 1
                changed = True
        self.report.matched = self.report.changed
        if self.options.remove_unused_attributes:
            for target in _unreached_attributes(graph_module):
                delete_attribute(graph_module, target)
                self.report.changed += 1
        return graph_module


def _unreached_attributes(graph_module: GraphModule) -> list[str]:
    """The outermost submodules/parameters/buffers no call_module or get_attr node reaches."""
    used = referenced_targets(graph_module)

    def reached(path: str) -> bool:
        return any(u == path or u.startswith(path + ".") or path.startswith(u + ".") for u in used)

    unreached: list[str] = []
    names = [name for name, _ in graph_module.named_modules() if name]
    names += [name for name, _ in graph_module.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in graph_module.named_buffers(remove_duplicate=False)]
    for name in sorted(set(names), key=lambda n: (n.count("."), n)):
        if reached(name) or any(name.startswith(outer + ".") for outer in unreached):
            continue
        unreached.append(name)
    return unreached
