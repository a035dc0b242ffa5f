"""FuseBiasInLinear: fold a linear layer's bias into its weight.

Matches (``fx`` frontend)::

    y = self.fc(x)                      # nn.Linear(d, n), bias b

Rewrites to::

    x1 = torch.nn.functional.pad(x, (0, 1), value=1.0)   # x with a column of ones
    y = self.fc(x1)                     # nn.Linear(d + 1, n, bias=False), weight [W | b]

On the ``export`` frontend ``aten.linear(x, W, b)`` becomes
``aten.linear(aten.constant_pad_nd(x, [0, 1], 1.0), [W | b])``.

Math: ``[W | b] · [x; 1] = W x + b``.

The layer is replaced by a new ``nn.Linear`` whose ``in_features`` is ``d + 1``;
the caller's layer is never touched. Every call site of a layer is rewritten,
so a layer called twice is fused once. ``reverse`` splits the weight back into
``W`` (``n × d``) and ``b`` (shape ``(n,)``, also when ``n == 1``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._modules import delete_if_unreferenced, fresh_target, get_attribute, has_attribute, set_submodule, set_tensor, split_target
from ._nodes import infer_val, inherit_provenance, is_get_attr
from .base import ReversibleTransformation
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_PAD_FUNCTIONS = (torch.nn.functional.pad, _aten.constant_pad_nd.default)


@dataclass
class _Layer:
    """A linear layer with a bias and its call sites."""

    key: str  # fx: the module path; export: "weight target|bias target"
    nodes: list[Node]
    used_elsewhere: bool  # fx: another node calls or reads the module in a way this pass cannot rewrite


@register_pass("fuse_bias_in_linear")
class FuseBiasInLinear(RewriteRule, ReversibleTransformation):
    """Folds the bias of linear layers into their weight, feeding the input padded with ones."""

    preserves_computation = True

    def candidates(self, graph_module: GraphModule) -> Iterator[Match[_Layer]]:
        """Each layer with a bias and all its call sites, found before any is rewritten."""
        sites: dict[str, list[Node]] = defaultdict(list)
        blocked: set[str] = set()  # layers with a call site or a use that cannot be rewritten
        for node in list(graph_module.graph.nodes):
            if _is_linear_with_bias(graph_module, node):
                key = _layer_key(node)
                if key:
                    sites[key.value].append(node)
                    continue
                yield key
            if node.op == "call_module":
                blocked.add(str(node.target))
            elif node.op == "get_attr":
                blocked.add(split_target(str(node.target))[0])
        for key, nodes in sites.items():
            used_elsewhere = nodes[0].op == "call_module" and key in blocked
            yield Match.ok(_Layer(key, nodes, used_elsewhere), sites=len(nodes))

    def check(self, graph_module: GraphModule, layer: _Layer) -> Match[_Layer]:
        if layer.used_elsewhere:
            return Match.fail(f"layer '{layer.key}' is also used in a way this pass cannot rewrite; left alone")
        return Match.ok(layer)

    def rewrite(self, graph_module: GraphModule, layer: _Layer) -> None:
        if layer.nodes[0].op == "call_module":
            self._fuse_module(graph_module, layer.key, layer.nodes)
        else:
            self._fuse_aten(graph_module, layer.nodes)

    def _pad_input(self, graph_module: GraphModule, node: Node, input_node: Node, fx: bool) -> Node:
        with graph_module.graph.inserting_before(node):
            if fx:
                padded = graph_module.graph.call_function(torch.nn.functional.pad, (input_node, (0, 1)), {"value": 1.0})
            else:
                padded = graph_module.graph.call_function(_aten.constant_pad_nd.default, (input_node, [0, 1], 1.0))
        inherit_provenance(node, padded)
        infer_val(graph_module, padded)
        self.mark_as_transformed(padded)
        return padded

    def _fuse_module(self, graph_module: GraphModule, target: str, nodes: list[Node]) -> None:
        module = graph_module.get_submodule(target)
        weight = torch.cat([module.weight.detach(), module.bias.detach()[:, None]], dim=1)
        fused = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        fused.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        set_submodule(graph_module, target, fused)
        for node in nodes:
            keyword = not node.args
            input_node = node.kwargs["input"] if keyword else node.args[0]
            padded = self._pad_input(graph_module, node, input_node, fx=True)
            node.args, node.kwargs = (padded,), {}
            self.mark_as_transformed(node)
            self.save_reverse_info(node, {"frontend": "fx", "target": target, "keyword": keyword})

    def _fuse_aten(self, graph_module: GraphModule, nodes: list[Node]) -> None:
        weight_node, bias_node = nodes[0].args[1], nodes[0].args[2]
        weight = get_attribute(graph_module, str(weight_node.target))
        bias = get_attribute(graph_module, str(bias_node.target))
        parent, name = split_target(str(weight_node.target))
        fused_target = fresh_target(graph_module, parent, f"{name}_bias_fused")
        set_tensor(graph_module, fused_target, torch.cat([weight.detach(), bias.detach()[:, None]], dim=1).requires_grad_(weight.requires_grad))
        with graph_module.graph.inserting_before(nodes[0]):
            fused_node = graph_module.graph.get_attr(fused_target)
        infer_val(graph_module, fused_node)
        for node in nodes:
            padded = self._pad_input(graph_module, node, node.args[0], fx=False)
            node.args = (padded, fused_node)
            self.mark_as_transformed(node)
            self.save_reverse_info(
                node,
                {"frontend": "export", "weight": str(weight_node.target), "bias": str(bias_node.target),
                 "weight_node": weight_node.name, "bias_node": bias_node.name},
            )
        for attr_node in (weight_node, bias_node):
            if not attr_node.users:
                graph_module.graph.erase_node(attr_node)
            delete_if_unreferenced(graph_module, str(attr_node.target))

    # -- reverse -----------------------------------------------------------------------

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        graph = graph_module.graph
        restored_modules: set[str] = set()
        restored_attrs: dict[str, Node] = {}
        for node in self.get_transformed_nodes(graph_module):
            if node.target in _PAD_FUNCTIONS:
                continue
            info = self.reverse_info(node)
            pad = node.args[0]
            if not (isinstance(pad, Node) and pad.target in _PAD_FUNCTIONS and self.transformed(pad)):
                raise ValueError(f"node '{node.name}': its input is no longer the padding this pass inserted")
            input_node = pad.args[0]
            if info["frontend"] == "fx":
                target = info["target"]
                if target not in restored_modules:
                    fused = graph_module.get_submodule(target)
                    weight, bias = _split(fused.weight)
                    layer = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
                    layer.weight = nn.Parameter(weight, requires_grad=fused.weight.requires_grad)
                    layer.bias = nn.Parameter(bias, requires_grad=fused.weight.requires_grad)
                    set_submodule(graph_module, target, layer)
                    restored_modules.add(target)
                node.args, node.kwargs = ((), {"input": input_node}) if info["keyword"] else ((input_node,), {})
            else:
                fused_node = node.args[1]
                weight, bias = _split(get_attribute(graph_module, str(fused_node.target)))
                operands = []
                for key, tensor in (("weight", weight), ("bias", bias)):
                    target = info[key]
                    if target not in restored_attrs:
                        if not has_attribute(graph_module, target):
                            set_tensor(graph_module, target, tensor)
                        with graph.inserting_before(fused_node):
                            restored_attrs[target] = graph.create_node("get_attr", target, name=info[f"{key}_node"])
                        infer_val(graph_module, restored_attrs[target])
                    operands.append(restored_attrs[target])
                node.args = (input_node, *operands)
                if not fused_node.users:
                    graph.erase_node(fused_node)
                    delete_if_unreferenced(graph_module, str(fused_node.target))
            graph.erase_node(pad)
            self.mark_as_restored(node)
        return graph_module


def _is_linear_with_bias(graph_module: GraphModule, node: Node) -> bool:
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        return type(module) is nn.Linear and module.bias is not None
    return node.op == "call_function" and node.target is _aten.linear.default and len(node.args) == 3 and not node.kwargs


def _layer_key(node: Node) -> Match[str]:
    """What identifies the layer a linear call runs: its module path (fx), its weight and bias targets (export)."""
    if node.op == "call_module":
        if len(node.args) + len(node.kwargs) != 1 or not isinstance(node.args[0] if node.args else node.kwargs.get("input"), Node):
            return Match.fail("unexpected call arguments", node=node)
        return Match.ok(str(node.target))
    weight, bias = node.args[1], node.args[2]
    if not (is_get_attr(weight) and is_get_attr(bias)):
        return Match.fail("weight or bias is computed, not a get_attr", node=node)
    return Match.ok(f"{weight.target}|{bias.target}")


def _split(fused_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[W | b]`` -> ``(W, b)`` with ``b`` of shape ``(n,)``, never 0-d."""
    fused_weight = fused_weight.detach()
    return fused_weight[:, :-1].clone(), fused_weight[:, -1].clone()
