"""The float32 ``nn.Linear`` layers a quantising pass may replace, each with all its call sites, and why not the others.

Shared by ``quantize_linear_int8`` and ``quantize_linear_weights``: a layer is a candidate once,
however many times the graph calls it (it is converted once and serves every site), and it is
left alone, with the reason, when a ``skip`` pattern names it, it is a subclass of ``nn.Linear``
or has hooks, a call passes other arguments than one input, or it does not compute in float32
on the CPU. An ``UpcastLinear`` (a bfloat16 or float16 weight widened where used) computes in
float32, and the quantisers widen its weight before rounding it: it is a candidate.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._layers import call_sites, is_plain_linear, linear_compute_dtype
from ._nodes import called_on_one_input
from .rule import Match

LinearLayer = tuple[str, list[Node]]  # the layer's module path and every node that calls it


def linear_layers(graph_module: GraphModule) -> Iterator[Match[LinearLayer]]:
    """Each nn.Linear with all its call sites."""
    for target, nodes in call_sites(graph_module, nn.Linear).items():
        yield Match.ok((target, nodes), sites=len(nodes))


def quantizable_miss(graph_module: GraphModule, layer: LinearLayer, skip: Sequence[str], what: str) -> str | None:
    """Why ``layer`` cannot be quantised (a one-line reason naming it), or None when it can; ``what``: the quantisation."""
    target, nodes = layer
    module = graph_module.get_submodule(target)
    where = describe(layer)
    pattern = next((pattern for pattern in skip if fnmatch.fnmatchcase(target, pattern)), None)
    if pattern is not None:
        return f"{where}: kept in float32, skip pattern {pattern!r}"
    if not is_plain_linear(module):
        return f"{where}: the layer is a subclass of nn.Linear or has hooks"
    if not all(called_on_one_input(node) for node in nodes):
        return f"{where}: unexpected call arguments at one of the layer's call sites"
    if linear_compute_dtype(module) != torch.float32 or (module.bias is not None and module.bias.dtype != torch.float32):
        return f"{where}: weights are {module.weight.dtype}, {what} starts from float32"
    if module.weight.device.type != "cpu":
        return f"{where}: weights are on {module.weight.device}, the {what} kernels are for the CPU"
    return None


def describe(layer: LinearLayer) -> str:
    target, nodes = layer
    return f"layer '{target}' ({', '.join(node.name for node in nodes)})"
