"""Recognising an inference-mode batch norm and folding it into an affine map.

In inference mode ``bn(y) = (y - μ) / sqrt(σ² + ε) · γ + β = y · s + t`` per channel, with

    s = γ / sqrt(σ² + ε)        t = β − μ · s

(``γ = 1`` and ``β = 0`` when ``affine=False``). A batch norm in training mode, or
one without running statistics (``track_running_stats=False``), normalises with
the statistics of the batch and cannot be folded.

Both frontends are recognised: an ``nn.BatchNorm1d/2d`` module call (``fx``) and
``aten.batch_norm`` / ``aten._native_batch_norm_legit_no_training`` whose
statistics and affine parameters are ``get_attr`` nodes (``export``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._modules import delete_if_unreferenced, get_attribute
from .base import Transformation

_aten = torch.ops.aten
_TRAINING_OPS = (_aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats, _aten._native_batch_norm_legit_functional.default)


@dataclass
class BatchNorm:
    """An inference-mode batch norm found in the graph."""

    node: Node  # the node computing the normalised tensor
    output: Node  # the node whose users see the normalised tensor (a getitem for tuple-returning ops)
    input: Node
    scale: torch.Tensor  # s, float64
    shift: torch.Tensor  # t, float64
    dtype: torch.dtype
    module_target: str | None  # fx: the BatchNorm module; export: None
    attr_nodes: tuple[Node, ...]  # export: the get_attr nodes it reads

    def erase(self, graph_module: GraphModule) -> None:
        """Removes the batch norm once its users were rerouted."""
        graph = graph_module.graph
        if self.output is not self.node:
            graph.erase_node(self.output)
        for user in list(self.node.users):
            graph.erase_node(user)  # unused getitems of the statistics outputs
        graph.erase_node(self.node)
        if self.module_target is not None:
            delete_if_unreferenced(graph_module, self.module_target)
        for attr_node in self.attr_nodes:
            if not attr_node.users:
                graph.erase_node(attr_node)
                delete_if_unreferenced(graph_module, str(attr_node.target))


def match_batch_norm(graph_module: GraphModule, node: Node, module_type: type[nn.Module]) -> BatchNorm | str | None:
    """The batch norm computed by ``node``; a reason string if it cannot be folded; None if it is no batch norm."""
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if type(module) is not module_type:
            return None
        if module.training:
            return f"'{node.target}' is in training mode"
        if module.running_mean is None or module.running_var is None:
            return f"'{node.target}' has track_running_stats=False: it normalises with batch statistics"
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], Node):
            return f"'{node.target}' is called with unexpected arguments"
        scale, shift = fold(module.running_mean, module.running_var, module.eps, module.weight, module.bias)
        return BatchNorm(node, node, node.args[0], scale, shift, module.running_mean.dtype, str(node.target), ())
    if node.op != "call_function":
        return None
    if node.target in _TRAINING_OPS:
        return f"node '{node.name}' normalises with batch statistics (training mode or no running stats)"
    if node.target is _aten.batch_norm.default:
        input_node, weight, bias, mean, var, training, _momentum, eps = node.args[:8]
        if training or mean is None or var is None:
            return f"node '{node.name}' normalises with batch statistics (training mode or no running stats)"
        output = node
    elif node.target is _aten._native_batch_norm_legit_no_training.default:
        input_node, weight, bias, mean, var, _momentum, eps = node.args[:7]
        getitems = [user for user in node.users if user.target is operator.getitem]
        if len(getitems) != len(node.users) or any(user.args[1] != 0 for user in getitems if user.users):
            return f"node '{node.name}': its statistics outputs are used"
        used = [user for user in getitems if user.args[1] == 0]
        if len(used) != 1:
            return f"node '{node.name}': output not read through a single getitem"
        output = used[0]
    else:
        return None
    operands = (mean, var, weight, bias)
    if not all(arg is None or (isinstance(arg, Node) and arg.op == "get_attr") for arg in operands):
        return f"node '{node.name}': statistics or affine parameters are computed, not get_attr"
    mean_t, var_t, weight_t, bias_t = (get_attribute(graph_module, str(arg.target)) if arg is not None else None for arg in operands)
    if mean_t.dim() != 1:
        return f"node '{node.name}': unexpected statistics shape"
    scale, shift = fold(mean_t, var_t, eps, weight_t, bias_t)
    attr_nodes = tuple(arg for arg in operands if arg is not None)
    return BatchNorm(node, output, input_node, scale, shift, mean_t.dtype, None, attr_nodes)


def fold(mean, var, eps, weight, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, t) of ``bn(y) = y · s + t``, in float64."""
    mean, var = mean.detach().double(), var.detach().double()
    gamma = weight.detach().double() if weight is not None else torch.ones_like(mean)
    beta = bias.detach().double() if bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + eps)
    return scale, beta - mean * scale


def single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


class BatchNormFusion(Transformation):
    """The loop both batch-norm fusions share: match each batch norm, count it, fuse it or say why not.

    Subclasses set ``batch_norm_class`` and implement ``_fuse``, which returns ``None``
    when it fused and the reason otherwise.
    """

    batch_norm_class: type[nn.Module]
    preserves_computation = True

    def transform(self, graph_module: GraphModule) -> GraphModule:
        for node in list(graph_module.graph.nodes):
            if node._erased:
                continue  # erased by an earlier fusion
            batch_norm = match_batch_norm(graph_module, node, self.batch_norm_class)
            if batch_norm is None:
                continue
            self.report.matched += 1
            if isinstance(batch_norm, str):
                self.note(batch_norm)
                continue
            reason = self._fuse(graph_module, batch_norm)
            if reason:
                self.note(reason)
            else:
                self.report.changed += 1
        return graph_module

    def _fuse(self, graph_module: GraphModule, batch_norm: BatchNorm) -> str | None:
        raise NotImplementedError
