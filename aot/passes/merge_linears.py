"""MergeLinears: one wide linear layer instead of several that read the same input.

Matches (``fx`` frontend)::

    q = self.attn.query(x)            # nn.Linear(d, n1)
    k = self.attn.key(x)              # nn.Linear(d, n2, bias=False)

Rewrites to::

    qk = self.attn.merged_query_key(x)    # nn.Linear(d, n1 + n2)
    q = qk[..., 0:n1]
    k = qk[..., n1:n1 + n2]

On the ``export`` frontend ``aten.linear(x, W_i, b_i)`` with ``get_attr`` weights
becomes one ``aten.linear(x, W, b)`` followed by ``aten.slice.Tensor(·, -1, start, stop)``.

Math: ``[W_1; W_2] x + [b_1; b_2] = [W_1 x + b_1; W_2 x + b_2]``. A bias-free layer
contributes a block of zeros to ``b`` (adding +0 is exact) and comes back from
``reverse`` without a bias.

Rules: only layers under the same parent module (unless ``across_scopes``), with
the same dtype and device, are merged; nothing is cast. Layers that keep narrow weights
(``UpcastLinear``, see ``model.weights_dtype``) merge into one that keeps them narrow. A layer called twice on
the same input contributes once. A layer still used on another input is kept.
Keyword calls (``self.query(input=x)``) are matched. ``reverse`` restores the
original layers, names and parameters exactly.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.fx import GraphModule, Node

from aot.runtime.upcast_weights import UpcastLinear

from ._layers import is_plain_linear
from ._modules import delete_if_unreferenced, fresh_target, get_attribute, has_attribute, set_submodule, set_tensor, split_target
from ._nodes import infer_val, inherit_provenance, is_get_attr
from .base import ReversibleTransformation
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten


@dataclass
class _Layer:
    """One distinct linear layer read by a group of call sites."""

    key: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    path: str  # module path of the layer (fx: its target; export: weight target minus ".weight")
    weight_target: str = ""
    bias_target: str | None = None
    nodes: list[Node] = field(default_factory=list)
    upcast_to: torch.dtype | None = None  # an UpcastLinear's compute dtype: the merged layer widens the same way


@dataclass
class _Group:
    """Distinct linear layers reading the same input, merged into one."""

    input: Node
    layers: list[_Layer]


@register_pass("merge_linears")
class MergeLinears(RewriteRule, ReversibleTransformation):
    """Merges linear layers that read the same input into one wide linear layer."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        min_group_size: int = Field(default=2, ge=2, description="Fewest distinct layers reading one input worth merging.")
        across_scopes: bool = Field(
            default=False,
            description="Also merge layers of different parent modules; the merged layer then lives in their closest common parent.",
        )

    # -- matching ----------------------------------------------------------------------

    def candidates(self, graph_module: GraphModule) -> Iterator[Match[_Group]]:
        """The groups of distinct layers reading one input; a layer alone on its input is a near miss."""
        groups: dict[tuple, dict[str, _Layer]] = defaultdict(dict)
        for node in list(graph_module.graph.nodes):
            if not _is_linear(graph_module, node):
                continue
            site = _linear_site(graph_module, node)
            if not site:
                yield site
                continue
            input_node, layer = site.value
            scope = "" if self.options.across_scopes else split_target(layer.path)[0]
            group_key = (input_node, scope, layer.weight.dtype, layer.upcast_to, layer.weight.device, node.op)
            groups[group_key].setdefault(layer.key, layer).nodes.append(node)
        yield from _scope_splits(groups)
        for (input_node, *_), layers in groups.items():
            if len(layers) < 2:
                [layer] = layers.values()
                yield Match.fail(f"input '{input_node.name}': '{layer.path}' is the only linear layer reading it; nothing to merge with")
            else:
                yield Match.ok(_Group(input_node, list(layers.values())))

    def check(self, graph_module: GraphModule, group: _Group) -> Match[_Group]:
        if len(group.layers) < self.options.min_group_size:
            return Match.fail(f"input '{group.input.name}': {len(group.layers)} layers, fewer than min_group_size")
        return Match.ok(group)

    # -- rewriting ---------------------------------------------------------------------

    def rewrite(self, graph_module: GraphModule, group: _Group) -> None:
        graph, input_node, layers = graph_module.graph, group.input, group.layers
        weight = torch.cat([layer.weight.detach() for layer in layers], dim=0)
        has_bias = [layer.bias is not None for layer in layers]
        bias = None
        if any(has_bias):
            bias = torch.cat(
                [layer.bias.detach() if layer.bias is not None else layer.weight.new_zeros(layer.weight.shape[0]) for layer in layers]
            )
        merged = _linear(weight, bias, requires_grad=layers[0].weight.requires_grad, upcast_to=layers[0].upcast_to)
        scope = _common_parent([layer.path for layer in layers])
        names = "_".join(split_target(layer.path)[1] for layer in layers)
        merged_target = fresh_target(graph_module, scope, f"merged_{names}")
        set_submodule(graph_module, merged_target, merged)

        first = min((node for layer in layers for node in layer.nodes), key=_position(graph))
        fx = first.op == "call_module"
        with graph.inserting_before(first):
            if fx:
                merged_node = graph.call_module(merged_target, (input_node,))
                extra_nodes: list[Node] = []
            else:
                extra_nodes = [graph.get_attr(f"{merged_target}.weight")]
                if bias is not None:
                    extra_nodes.append(graph.get_attr(f"{merged_target}.bias"))
                merged_node = graph.call_function(_aten.linear.default, (input_node, *extra_nodes))
        for extra in extra_nodes:
            infer_val(graph_module, extra)
        inherit_provenance(first, merged_node)
        scope_meta = first.meta.get("scope")
        if hasattr(scope_meta, "_replace"):
            merged_node.meta["scope"] = scope_meta._replace(module_path=merged_target)
        infer_val(graph_module, merged_node)

        start = 0
        saved_layers = []
        for layer in layers:
            stop = start + layer.weight.shape[0]
            saved_nodes = []
            for node in layer.nodes:
                saved_nodes.append({"name": node.name, "keyword": bool(node.kwargs), "weight_node": _arg_name(node, 1), "bias_node": _arg_name(node, 2)})
                _to_slice(node, merged_node, start, stop, fx)
            saved_layers.append(
                {"path": layer.path, "weight": layer.weight_target, "bias": layer.bias_target, "out_features": stop - start,
                 "has_bias": layer.bias is not None, "nodes": saved_nodes}
            )
            start = stop
        self.mark_as_transformed(merged_node)
        self.save_reverse_info(merged_node, {"frontend": "fx" if fx else "export", "merged": merged_target, "layers": saved_layers})
        self._drop_originals(graph_module, layers, fx)
        for layer in layers:  # the group outlives this rewrite: let the originals go now, not after the last group
            layer.weight = layer.bias = None

    def _drop_originals(self, graph_module: GraphModule, layers: list[_Layer], fx: bool) -> None:
        for layer in layers:
            if fx:
                delete_if_unreferenced(graph_module, layer.path)
                continue
            for node in list(graph_module.graph.nodes):
                if node.op == "get_attr" and str(node.target) in (layer.weight_target, layer.bias_target) and not node.users:
                    graph_module.graph.erase_node(node)
            for target in (layer.weight_target, layer.bias_target):
                if target:
                    delete_if_unreferenced(graph_module, target)

    # -- reverse -----------------------------------------------------------------------

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        graph = graph_module.graph
        for merged_node in self.get_transformed_nodes(graph_module):
            info = self.reverse_info(merged_node)
            merged = graph_module.get_submodule(info["merged"])
            input_node = merged_node.args[0]
            start = 0
            for layer in info["layers"]:
                stop = start + layer["out_features"]
                weight = merged.weight[start:stop].detach().clone()
                bias = merged.bias[start:stop].detach().clone() if layer["has_bias"] else None
                users = [user for user in merged_node.users if _slice_range(user) == (start, stop)]
                start = stop
                if info["frontend"] == "fx":
                    if not has_attribute(graph_module, layer["path"]):
                        set_submodule(graph_module, layer["path"], _linear(weight, bias, merged.weight.requires_grad, _upcast_to(merged)))
                    keyword = any(saved["keyword"] for saved in layer["nodes"])
                    for node in users:
                        _to_module_call(node, layer["path"], input_node, keyword)
                    continue
                operands = self._restore_weights(graph_module, merged_node, layer, weight, bias)
                for node in users:
                    node.target = _aten.linear.default
                    node.args = (input_node, *operands)
                    node.kwargs = {}
            attr_nodes = [arg for arg in merged_node.args[1:] if isinstance(arg, Node)]
            graph.erase_node(merged_node)
            for attr_node in attr_nodes:
                if not attr_node.users:
                    graph.erase_node(attr_node)
            delete_if_unreferenced(graph_module, info["merged"])
        return graph_module

    def _restore_weights(self, graph_module: GraphModule, merged_node: Node, layer: dict[str, Any], weight, bias) -> list[Node]:
        operands = []
        for key, tensor in (("weight", weight), ("bias", bias)):
            target = layer[key]
            if target is None:
                continue
            if not has_attribute(graph_module, target):
                set_tensor(graph_module, target, tensor, parameter=True)
            wanted = layer["nodes"][0][f"{key}_node"]
            with graph_module.graph.inserting_before(merged_node):
                attr_node = graph_module.graph.create_node("get_attr", target, name=wanted)
            infer_val(graph_module, attr_node)
            operands.append(attr_node)
        return operands


def _linear_site(graph_module: GraphModule, node: Node) -> Match[tuple[Node, _Layer]]:
    """The input ``node`` applies a linear layer to, and the layer; or why it cannot be merged."""
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if not is_plain_linear(module):
            return Match.fail(f"'{node.target}' is a subclass of nn.Linear or has hooks", node=node)
        operands = list(node.args) + list(node.kwargs.values())
        if len(operands) != 1 or not isinstance(operands[0], Node) or set(node.kwargs) - {"input"}:
            return Match.fail("unexpected call arguments", node=node)
        return Match.ok((operands[0], _Layer(str(node.target), module.weight, module.bias, str(node.target), upcast_to=_upcast_to(module))))
    input_node, weight, bias = (list(node.args) + [None, None])[:3]
    bias = node.kwargs.get("bias", bias)
    if not is_get_attr(weight) or not (bias is None or is_get_attr(bias)) or not isinstance(input_node, Node):
        return Match.fail("weight or bias is computed, not a get_attr", node=node)
    weight_target = str(weight.target)
    bias_target = str(bias.target) if bias is not None else None
    layer = _Layer(
        key=f"{weight_target}|{bias_target}",
        weight=get_attribute(graph_module, weight_target),
        bias=get_attribute(graph_module, bias_target) if bias_target else None,
        path=split_target(weight_target)[0] if weight_target.endswith(".weight") else weight_target,
        weight_target=weight_target,
        bias_target=bias_target,
    )
    return Match.ok((input_node, layer))


def _is_linear(graph_module: GraphModule, node: Node) -> bool:
    if node.op == "call_module":
        return isinstance(graph_module.get_submodule(str(node.target)), nn.Linear)
    return node.op == "call_function" and node.target is _aten.linear.default


def _scope_splits(groups: dict[tuple, dict[str, _Layer]]) -> Iterator[Match]:
    """Near misses: linear layers on one input kept apart by their scope or dtype."""
    by_input: dict[Node, list[tuple]] = defaultdict(list)
    for key in groups:
        by_input[key[0]].append(key)
    for input_node, keys in by_input.items():
        if len(keys) > 1:
            described = sorted({f"{key[1] or '<root>'} ({key[2]})" for key in keys})
            yield Match.fail(
                f"input '{input_node.name}': linear layers in different scopes or dtypes not merged together: {', '.join(described)}"
            )


def _arg_name(node: Node, index: int) -> str | None:
    value = node.args[index] if len(node.args) > index else None
    return value.name if isinstance(value, Node) else None


def _upcast_to(layer: nn.Linear) -> torch.dtype | None:
    """The dtype an ``UpcastLinear`` widens its weight to; None for a plain ``nn.Linear``."""
    return layer.compute_dtype if isinstance(layer, UpcastLinear) else None


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, requires_grad: bool, upcast_to: torch.dtype | None = None) -> nn.Linear:
    """An ``nn.Linear`` holding ``weight`` and ``bias``; an ``UpcastLinear`` widening them to ``upcast_to`` when given."""
    widening = {"compute_dtype": upcast_to} if upcast_to is not None else {}
    layer = nn.utils.skip_init(UpcastLinear if upcast_to is not None else nn.Linear, weight.shape[1], weight.shape[0],
                               bias=bias is not None, device=weight.device, dtype=weight.dtype, **widening)
    layer.weight = nn.Parameter(weight, requires_grad=requires_grad)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=requires_grad)
    return layer


def _common_parent(paths: list[str]) -> str:
    parents = [split_target(path)[0].split(".") if split_target(path)[0] else [] for path in paths]
    common = []
    for atoms in zip(*parents):
        if len(set(atoms)) != 1:
            break
        common.append(atoms[0])
    return ".".join(common)


def _position(graph):
    order = {node: index for index, node in enumerate(graph.nodes)}
    return order.__getitem__


def _to_slice(node: Node, merged_node: Node, start: int, stop: int, fx: bool) -> None:
    if fx:
        node.op = "call_function"
        node.target = operator.getitem
        node.args = (merged_node, (Ellipsis, slice(start, stop)))
    else:
        node.target = _aten.slice.Tensor
        node.args = (merged_node, -1, start, stop)
    node.kwargs = {}


def _to_module_call(node: Node, target: str, input_node: Node, keyword: bool) -> None:
    node.op = "call_module"
    node.target = target
    node.args, node.kwargs = ((), {"input": input_node}) if keyword else ((input_node,), {})


def _slice_range(node: Node) -> tuple[int, int] | None:
    """(start, stop) of a slice this pass made of the merged output."""
    if node.target is operator.getitem:
        index = node.args[1]
        if isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis and isinstance(index[1], slice):
            return index[1].start, index[1].stop
    elif node.target is _aten.slice.Tensor and len(node.args) == 4:
        return node.args[2], node.args[3]
    return None
