"""Recompute every node's ``meta["val"]`` on fake tensors, checking what fake tensors do not: that dtypes agree.

A pass that changes dtypes (``cast_precision``) must leave ``meta["val"]`` true, since later
passes read dtypes there (``remove_redundant_casts``), and must know the graph still runs.
FakeTensorProp answers both, but a fake matmul does not check that its operands share a dtype
(a real one refuses float32 times bfloat16): a node whose inputs mix float dtypes therefore
also runs for real, on zeros of its inputs' shapes. Such nodes are few (a graph cast to one
dtype has almost none), so the check costs little.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_aggregate


class UnrunnableNode(Exception):
    """A node that could not run (on fake tensors, or on zeros), with the error it raised."""

    def __init__(self, node: Node, error: Exception) -> None:
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", repr(node.target))
        super().__init__(f"node '{node.name}' ({node.op} {target}) raised {_first_line(error)}")


def recompute_values(graph_module: GraphModule) -> None:
    """Recomputes every node's ``meta["val"]`` from the graph inputs' fake values.

    Raises ``UnrunnableNode`` naming the first node that fails (on fake tensors, or for real where
    it mixes float dtypes), and ValueError when a graph input has no fake value to start from.
    """
    from aot.compat.torch_private import FakeTensorProp, detect_fake_mode

    class Propagation(FakeTensorProp):
        def run_node(self, node: Node):
            try:
                result = super().run_node(node)
                if _mixes_float_dtypes(graph_module, node):
                    _run_on_zeros(graph_module, node)
                return result
            except UnrunnableNode:
                raise
            except Exception as error:
                raise UnrunnableNode(node, error) from error

    inputs = [node.meta.get("val") for node in graph_module.graph.nodes if node.op == "placeholder"]
    mode = detect_fake_mode([value for value in inputs if isinstance(value, torch.Tensor)])
    if mode is None or not all(isinstance(value, torch.Tensor) for value in inputs):
        raise ValueError("a graph input has no fake value (meta['val'])")
    with torch.no_grad():  # no autograd history in meta["val"]: it would keep the weights alive
        Propagation(graph_module, mode=mode).propagate_dont_convert_inputs(*inputs)


def _mixes_float_dtypes(graph_module: GraphModule, node: Node) -> bool:
    values = [arg.meta.get("val") for arg in node.all_input_nodes]
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        values += list(module.parameters()) + list(module.buffers())
    return len({value.dtype for value in values if isinstance(value, torch.Tensor) and value.is_floating_point()}) > 1


def _run_on_zeros(graph_module: GraphModule, node: Node) -> None:
    from aot.compat.torch_private import unset_fake_temporarily

    def zeros(arg):
        val = arg.meta.get("val") if isinstance(arg, Node) else arg
        if isinstance(val, torch.Tensor) and all(isinstance(size, int) for size in val.shape):
            return torch.zeros(val.shape, dtype=val.dtype, device=val.device)
        return val

    with unset_fake_temporarily():
        args, kwargs = map_aggregate(node.args, zeros), map_aggregate(node.kwargs, zeros)
        if node.op == "call_module":
            graph_module.get_submodule(str(node.target))(*args, **kwargs)
        elif node.op == "call_function":
            node.target(*args, **kwargs)
        elif node.op == "call_method":
            getattr(args[0], str(node.target))(*args[1:], **kwargs)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
