"""Linear layers of ATen graphs (``torch.export``), seen as modules that hold their tensors.

An ATen graph computes a linear layer as one of::

    aten.linear(x, w, b)      # nn.Linear: w is (out, in)
    aten.addmm(b, x, w)       # transformers' Conv1D (GPT-2): w is (in, out), x is 2-D

with ``w`` and ``b`` read by ``get_attr`` from a module (``lm_head``, ``attn.c_attn``) that holds
nothing else. Such a holder can become a module that computes the layer itself (a
``OneDNNLinear``) under the same path, so the state dict keeps its keys; ``reverse``
gives the holder and the ATen call back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._modules import split_target
from ._nodes import infer_val, is_get_attr
from .rule import Match

_aten = torch.ops.aten


@dataclass(frozen=True)
class AtenLinear:
    """One call site's operands: ``input @ weight.T + bias`` (``transposed``: ``input @ weight + bias``)."""

    input: Node
    weight: Node
    bias: Node | None
    transposed: bool


def aten_linear(node: Node) -> AtenLinear | None:
    """The operands of ``aten.linear`` / ``aten.addmm`` reading a ``get_attr`` weight, or None."""
    if node.op != "call_function" or node.kwargs:
        return None
    args = node.args
    if node.target is _aten.linear.default and len(args) in (2, 3) and is_get_attr(args[1]):
        bias = args[2] if len(args) == 3 else None
        return AtenLinear(args[0], args[1], bias, transposed=False)
    if node.target is _aten.addmm.default and len(args) == 3 and is_get_attr(args[2]):  # beta = alpha = 1
        return AtenLinear(args[1], args[2], args[0], transposed=True)
    return None


def aten_call_sites(graph_module: GraphModule) -> dict[str, list[Node]]:
    """Linear call sites on a ``get_attr`` weight named ``weight``, by the path of the module holding it."""
    sites: dict[str, list[Node]] = {}
    for node in graph_module.graph.nodes:
        operands = aten_linear(node)
        if operands is not None:
            holder, name = split_target(str(operands.weight.target))
            if holder and name == "weight":
                sites.setdefault(holder, []).append(node)
    return sites


@dataclass(frozen=True)
class HeldLayer:
    """A holder's weight as (out, in), its bias, and whether the graph stores the weight transposed."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    transposed: bool

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]


def held_layer(graph_module: GraphModule, holder: str, nodes: list[Node]) -> Match[HeldLayer]:
    """The layer the module at ``holder`` holds, if it holds its tensors alone and every site reads them alike.

    A transposed (Conv1D) weight is copied into the (out, in) layout a linear layer has,
    so the holder's weight must be read by these sites only.
    """
    operands = [aten_linear(node) for node in nodes]
    kinds = {(site.transposed, None if site.bias is None else str(site.bias.target) if is_get_attr(site.bias) else "") for site in operands}
    if len(kinds) > 1:
        return Match.fail("its call sites read it in different ways (linear and addmm, or different biases)")
    transposed, bias_target = kinds.pop()
    if bias_target == "":
        return Match.fail("its bias is computed, not a get_attr")
    if bias_target is not None and bias_target != f"{holder}.bias":
        return Match.fail(f"its bias '{bias_target}' lives in another module")
    module = graph_module.get_submodule(holder)
    tensors = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
    children = len(list(module.children()))
    expected = {"weight"} | ({"bias"} if bias_target else set())
    if set(tensors) != expected or children:  # the graph reads only its tensors, so it may become the layer
        return Match.fail(f"the module holding the weight holds {sorted(tensors)} and {children} submodules, not the layer's tensors alone")
    weight, bias = tensors["weight"], tensors.get("bias")
    if not isinstance(weight, nn.Parameter) or weight.dim() != 2 or (bias is not None and not isinstance(bias, nn.Parameter)):
        return Match.fail("the weight is a buffer or not 2-D, or the bias is a buffer")
    if transposed:
        readers = [node for node in graph_module.graph.nodes if node.op == "get_attr" and node.target == f"{holder}.weight"]
        if any(set(reader.users) - set(nodes) for reader in readers):
            return Match.fail("its (in, out) weight is also read by other nodes")
        weight = nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad)
    if bias is not None and bias.shape != weight.shape[:1]:
        return Match.fail("the bias does not fit the weight")
    return Match.ok(HeldLayer(weight, bias, transposed))


def call_holder_instead(graph_module: GraphModule, node: Node, holder: str) -> Node:
    """Replaces the ATen linear ``node`` by a call of the module at ``holder``; weight reads go once unused."""
    graph = graph_module.graph
    operands = aten_linear(node)
    with graph.inserting_before(node):
        call = graph.call_module(holder, (operands.input,))
    call.meta.update(node.meta)
    node.replace_all_uses_with(call)
    graph.erase_node(node)
    for read in (operands.weight, operands.bias):
        if read is not None and not read.users:
            graph.erase_node(read)
    return call


def aten_linear_instead(graph_module: GraphModule, node: Node, layer: nn.Module, transposed: bool) -> Node:
    """Replaces the call of ``layer`` at ``node`` by the ATen call on ``get_attr`` reads of the holder that ``restored_holder`` gives."""
    graph, holder = graph_module.graph, str(node.target)
    with graph.inserting_before(node):
        weight = graph.get_attr(f"{holder}.weight")
        bias = graph.get_attr(f"{holder}.bias") if layer.bias is not None else None
        if transposed:
            linear = graph.call_function(_aten.addmm.default, (bias, node.args[0], weight))
        else:
            linear = graph.call_function(_aten.linear.default, (node.args[0], weight) + ((bias,) if bias is not None else ()))
    linear.meta.update(node.meta)
    node.replace_all_uses_with(linear)
    graph.erase_node(node)
    return linear


def restored_holder(layer: nn.Module, transposed: bool) -> nn.Module:
    """A plain module holding the layer's Parameters as the graph read them (transposed back for addmm)."""
    holder = nn.Module()
    weight = layer.weight
    holder.weight = nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad) if transposed else weight
    if layer.bias is not None:
        holder.bias = layer.bias
    return holder


def infer_reads(graph_module: GraphModule, node: Node) -> None:
    """Fills ``val`` of the ``get_attr`` reads ``node`` takes."""
    for read in node.all_input_nodes:
        if read.op == "get_attr":
            infer_val(graph_module, read)
