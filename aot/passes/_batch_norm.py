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
from abc import abstractmethod
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._modules import delete_if_unreferenced, get_attribute
from ._nodes import is_get_attr
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_TRAINING_OPS = (_aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats, _aten._native_batch_norm_legit_functional.default)
_BATCH_NORM_OPS = (*_TRAINING_OPS, _aten.batch_norm.default, _aten._native_batch_norm_legit_no_training.default)


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


def is_batch_norm(graph_module: GraphModule, node: Node, module_class: type[nn.Module]) -> bool:
    """Whether ``node`` calls a ``module_class`` module (fx) or an aten batch norm (export), in any mode."""
    if node.op == "call_module":
        return type(graph_module.get_submodule(str(node.target))) is module_class
    return node.op == "call_function" and node.target in _BATCH_NORM_OPS


def inference_batch_norm(graph_module: GraphModule, node: Node) -> Match[BatchNorm]:
    """The batch norm ``node`` computes (``is_batch_norm`` holds), folded; a failure says why it cannot be folded."""
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if module.training:
            return Match.fail(f"'{node.target}' is in training mode")
        if module.running_mean is None or module.running_var is None:
            return Match.fail(f"'{node.target}' has track_running_stats=False: it normalises with batch statistics")
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], Node):
            return Match.fail(f"'{node.target}' is called with unexpected arguments")
        scale, shift = fold(module.running_mean, module.running_var, module.eps, module.weight, module.bias)
        return Match.ok(BatchNorm(node, node, node.args[0], scale, shift, module.running_mean.dtype, str(node.target), ()))
    if node.target in _TRAINING_OPS:
        return Match.fail("normalises with batch statistics (training mode or no running stats)", node=node)
    if node.target is _aten.batch_norm.default:
        input_node, weight, bias, mean, var, training, _momentum, eps = node.args[:8]
        if training or mean is None or var is None:
            return Match.fail("normalises with batch statistics (training mode or no running stats)", node=node)
        output = node
    else:  # _native_batch_norm_legit_no_training: (normalised, mean, invstd), read through getitems
        input_node, weight, bias, mean, var, _momentum, eps = node.args[:7]
        getitems = [user for user in node.users if user.target is operator.getitem]
        if len(getitems) != len(node.users) or any(user.args[1] != 0 for user in getitems if user.users):
            return Match.fail("its statistics outputs are used", node=node)
        used = [user for user in getitems if user.args[1] == 0]
        if len(used) != 1:
            return Match.fail("output not read through a single getitem", node=node)
        output = used[0]
    operands = (mean, var, weight, bias)
    if not all(arg is None or is_get_attr(arg) for arg in operands):
        return Match.fail("statistics or affine parameters are computed, not get_attr", node=node)
    mean_t, var_t, weight_t, bias_t = (get_attribute(graph_module, str(arg.target)) if arg is not None else None for arg in operands)
    if mean_t.dim() != 1:
        return Match.fail("unexpected statistics shape", node=node)
    scale, shift = fold(mean_t, var_t, eps, weight_t, bias_t)
    attr_nodes = tuple(arg for arg in operands if arg is not None)
    return Match.ok(BatchNorm(node, output, input_node, scale, shift, mean_t.dtype, None, attr_nodes))


def fold(mean, var, eps, weight, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, t) of ``bn(y) = y · s + t``, in float64."""
    mean, var = mean.detach().double(), var.detach().double()
    gamma = weight.detach().double() if weight is not None else torch.ones_like(mean)
    beta = bias.detach().double() if bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + eps)
    return scale, beta - mean * scale


class BatchNormFusion(RewriteRule):
    """What both batch-norm fusions share: the pattern is a batch norm of ``batch_norm_class``;
    the check folds it, then ``check_layer`` finds the layer it fuses into.
    """

    batch_norm_class: type[nn.Module]
    preserves_computation = True

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        return is_batch_norm(graph_module, node, self.batch_norm_class)

    def check(self, graph_module: GraphModule, node: Node) -> Match:
        batch_norm = inference_batch_norm(graph_module, node)
        return self.check_layer(graph_module, batch_norm.value) if batch_norm else batch_norm

    @abstractmethod
    def check_layer(self, graph_module: GraphModule, batch_norm: BatchNorm) -> Match:
        """The layer ``batch_norm`` folds into, with what ``rewrite`` needs; or why there is none."""
