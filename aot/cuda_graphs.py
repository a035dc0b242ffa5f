"""The build's side of ``export.graph_module.cuda_graphs``: what the saved module's buckets need, and what refuses them.

``module.py`` replays one CUDA graph per shape bucket (:mod:`aot.runtime.cuda_graph_buckets`). For it,
the build writes into ``gm.meta["cuda_graphs"]``:

- ``buckets``: the recipe's sizes per dim;
- ``input_axes``: which axis of which input is each bucketed dim (the recipe's dynamic axes);
- ``output_axes``: per output leaf (in ``torch.utils._pytree`` order), which axes follow a bucketed dim,
  found by running the graph at the build's shape cases: an axis follows a dim when its size is the
  dim's size in every case, and the cases differ in it;
- ``pad_values``: 0 for every input (the attention mask is 0 over the padding);
- ``device``: the recipe's, where ``load()`` puts a CUDA build's model (so that it can capture at load).

A graph that a CUDA graph cannot capture is refused here, naming the node: a value read back to the
CPU (``.item()``, ``.tolist()``, a tensor's size from its data), an assertion on a value, a copy to
the CPU, or an op whose output size depends on the data.
"""

from __future__ import annotations

from typing import Any

import torch

from aot.compat.torch_private import pytree
from aot.errors import ExportError
from aot.inputs import ShapeCase

# Ops (by bare name: aten's and torch's alike) that sync with the CPU or size their output from the data.
_UNCAPTURABLE = {
    "_local_scalar_dense": "reads a value back to the CPU",
    "item": "reads a value back to the CPU",
    "tolist": "reads values back to the CPU",
    "cpu": "copies to the CPU",
    "numpy": "copies to the CPU",
    "nonzero": "sizes its output from the data",
    "masked_select": "sizes its output from the data",
    "unique": "sizes its output from the data",
    "unique_consecutive": "sizes its output from the data",
    "_unique2": "sizes its output from the data",
    "unique_dim": "sizes its output from the data",
    "_assert": "asserts on a value, a CPU sync",
    "_assert_async": "asserts on a value, a CPU sync",
    "_assert_scalar": "asserts on a value, a CPU sync",
}


def uncapturable(graph_module: torch.fx.GraphModule) -> tuple[str, str] | None:
    """``(node name, why)`` of the first node a CUDA graph cannot capture, or None."""
    for node in graph_module.graph.nodes:
        if node.op == "call_method":
            name = str(node.target)
        elif node.op == "call_function":
            packet = getattr(node.target, "overloadpacket", None)
            name = getattr(packet if packet is not None else node.target, "__name__", "")
            if name in ("_to_copy", "to") and str(node.kwargs.get("device", "")) == "cpu":
                return node.name, "copies to the CPU"
        else:
            continue
        if name in _UNCAPTURABLE:
            return node.name, _UNCAPTURABLE[name]
    return None


def cuda_graph_spec(buckets: dict[str, list[int]], input_axes: dict[str, dict[int, str]], graph_module: torch.fx.GraphModule,
                    cases: list[ShapeCase], device: str) -> dict[str, Any]:
    """``gm.meta["cuda_graphs"]`` for ``buckets`` (see the module docstring); ExportError naming a node that refuses them."""
    refused = uncapturable(graph_module)
    if refused is not None:
        node, why = refused
        raise ExportError(f"export.graph_module.cuda_graphs: node '{node}' {why}: a CUDA graph cannot capture it")
    bucketed_inputs = {name: {axis: dim for axis, dim in axes.items() if dim in buckets} for name, axes in input_axes.items()}
    return {
        "buckets": {dim: sorted(set(sizes)) for dim, sizes in buckets.items()},
        "input_axes": {name: {str(axis): dim for axis, dim in axes.items()} for name, axes in bucketed_inputs.items() if axes},
        "output_axes": _output_axes(graph_module, cases, list(buckets)),
        "pad_values": {name: 0 for name in bucketed_inputs},
        "device": device,
    }


def _output_axes(graph_module: torch.fx.GraphModule, cases: list[ShapeCase], dims: list[str]) -> list[dict[str, str]]:
    """Per output leaf, ``{axis: dim}`` for the axes whose size is that dim's in every case."""
    shapes_per_case = []
    with torch.no_grad():
        for case in cases:
            leaves = pytree.tree_leaves(graph_module(**case.inputs))
            shapes_per_case.append([tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else None for leaf in leaves])
    axes_per_leaf = []
    for leaf_index, first in enumerate(shapes_per_case[0]):
        axes: dict[str, str] = {}
        for axis in range(len(first or ())):
            for dim in dims:
                sizes = [case.dims.get(dim) for case in cases]
                if None in sizes or len(set(sizes)) < 2:
                    continue
                if all(shapes[leaf_index] is not None and shapes[leaf_index][axis] == size for shapes, size in zip(shapes_per_case, sizes)):
                    axes[str(axis)] = dim
                    break
        axes_per_leaf.append(axes)
    return axes_per_leaf
