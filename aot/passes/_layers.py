"""Reading a conv or linear layer's parameters, and giving it new ones without touching the caller's copy.

``layer_parameters`` finds the weight and bias of a layer call on either frontend.

``fx`` frontend: the layer module is replaced by a shallow copy holding the new
parameters, at the same target when no other node uses that module and under a
fresh name otherwise (so a module called elsewhere keeps computing what it did).
``export`` frontend: the new tensors are registered next to the old ones and
read through new ``get_attr`` nodes; old ones nothing reads any more are removed.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn
from torch.fx import GraphModule, Node

from aot.runtime.upcast_weights import UpcastLinear

from ._modules import delete_if_unreferenced, fresh_target, get_attribute, set_submodule, set_tensor, shallow_copy, split_target
from ._nodes import infer_val, is_get_attr
from .rule import Match

LayerParameters = tuple[torch.Tensor, "torch.Tensor | None"]


def is_plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` that computes its formula and nothing else: ``nn.Linear`` itself, or an
    ``UpcastLinear`` (its weight kept narrow and widened where used, see ``model.weights_dtype``),
    without hooks. A pass that rebuilds the layer from its weight and bias computes the same.
    """
    return type(module) in (nn.Linear, UpcastLinear) and not (module._forward_hooks or module._forward_pre_hooks)


def linear_compute_dtype(linear: nn.Linear) -> torch.dtype:
    """The dtype a plain linear layer computes in: its weight's, or the one an UpcastLinear widens it to."""
    return linear.compute_dtype if isinstance(linear, UpcastLinear) else linear.weight.dtype


def layer_parameters(graph_module: GraphModule, node: Node, layer_class: type[nn.Module], functions: Collection) -> Match[LayerParameters]:
    """(weight, bias) of ``node``: a call of a ``layer_class`` module (not a subclass) on one input,
    or of one of the aten ``functions`` on ``get_attr`` weights. The bias is None when there is none.
    """
    kind = layer_class.__name__
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if type(module) is not layer_class:
            return Match.fail(f"not an {kind}", node=node)
        if len(node.args) != 1 or node.kwargs:
            return Match.fail(f"{kind} called with unexpected arguments", node=node)
        return Match.ok((module.weight, module.bias))
    if node.op != "call_function" or node.target not in functions:
        return Match.fail(f"not an {kind}", node=node)
    weight = node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    if node.kwargs or not is_get_attr(weight) or not (bias is None or is_get_attr(bias)):
        return Match.fail("weight or bias is computed, not a get_attr", node=node)
    bias_tensor = get_attribute(graph_module, str(bias.target)) if bias is not None else None
    return Match.ok((get_attribute(graph_module, str(weight.target)), bias_tensor))


def call_sites(graph_module: GraphModule, layer_class: type[nn.Module]) -> dict[str, list[Node]]:
    """Each ``layer_class`` submodule called in the graph, by path, with its call nodes in graph order."""
    sites: dict[str, list[Node]] = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_module" and isinstance(graph_module.get_submodule(str(node.target)), layer_class):
            sites.setdefault(str(node.target), []).append(node)
    return sites


def layer_used_elsewhere(graph_module: GraphModule, node: Node) -> bool:
    target = str(node.target)
    for other in graph_module.graph.nodes:
        if other is node or other.op not in ("call_module", "get_attr"):
            continue
        if other.target == target or str(other.target).startswith(target + "."):
            return True
    return False


def set_layer_parameters(graph_module: GraphModule, node: Node, weight: torch.Tensor, bias: torch.Tensor, suffix: str) -> None:
    """Makes layer ``node`` (an nn.Conv2d/nn.Linear call or an aten conv/linear) use ``weight`` and ``bias``."""
    if node.op == "call_module":
        target = str(node.target)
        module = graph_module.get_submodule(target)
        layer = shallow_copy(module)
        requires_grad = module.weight.requires_grad
        layer.weight = nn.Parameter(weight, requires_grad=requires_grad)
        layer.bias = nn.Parameter(bias, requires_grad=requires_grad)
        if layer_used_elsewhere(graph_module, node):
            parent, name = split_target(target)
            target = fresh_target(graph_module, parent, f"{name}_{suffix}")
        set_submodule(graph_module, target, layer)
        node.target = target
        return
    args = list(node.args)
    if len(args) < 3:
        args += [None] * (3 - len(args))
    for index, tensor in ((1, weight), (2, bias)):
        old = args[index]
        if isinstance(old, Node):
            parent, name = split_target(str(old.target))
        else:  # a conv without bias: put the new bias beside the weight
            parent, name = split_target(str(args[1].target))[0], "bias"
        target = fresh_target(graph_module, parent, f"{name}_{suffix}")
        set_tensor(graph_module, target, tensor, parameter=True)
        with graph_module.graph.inserting_before(node):
            attr_node = graph_module.graph.get_attr(target)
        infer_val(graph_module, attr_node)
        args[index] = attr_node
        node.args = tuple(args)
        if isinstance(old, Node) and not old.users:
            graph_module.graph.erase_node(old)
            delete_if_unreferenced(graph_module, str(old.target))
