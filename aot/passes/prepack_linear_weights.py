"""PrepackLinearWeights: linear layers on pre-packed oneDNN weights, with a following GELU/ReLU fused in.

Matches (``fx`` frontend)::

    h = self.intermediate.dense(x)          # nn.Linear(768, 3072), float32/bfloat16, on CPU
    y = torch.nn.functional.gelu(h)         # optional: the only user of h; also nn.GELU, transformers'
                                            # GELUActivation, nn.ReLU, F.relu, torch.relu, h.relu()

Rewrites to::

    y = self.intermediate.dense(x)          # aot.runtime.OneDNNLinear(768, 3072, bias=True,
                                            #     activation="gelu", batch_size_hint=128)

The new module sits at the same path and holds the same ``weight`` and ``bias``
Parameters (shared, not copied), so the state dict keeps its keys and plain
tensors. A linear with no fusable activation after it becomes a
``OneDNNLinear`` with ``activation="none"``.

transformers' ``Conv1D`` (GPT-2's layers, a leaf of the ``fx`` frontend) computes ``x W + b``
with ``W`` of shape (in, out); it becomes a ``OneDNNLinear`` holding ``W^T`` under the same key.

Matches (``export`` frontend, ATen graphs)::

    w = self.lm_head.weight                  # get_attr of a Parameter (32000, 512); lm_head holds it alone
    h = torch.ops.aten.linear.default(x, w)
    y = torch.ops.aten.gelu.default(h)       # optional, as above; also aten.relu

Rewrites to::

    y = self.lm_head(x)                      # aot.runtime.OneDNNLinear(512, 32000, bias=False, activation="gelu")

``aten.addmm(b, x, w)`` with ``w`` of shape (in, out), how transformers' ``Conv1D``
(GPT-2) runs, matches too; its weight is then held as ``w.T``, the (out, in) layout of a
linear layer (``x w + b = x (w^T)^T + b``), under the same key. The container module
that holds the weight (and its bias) becomes the ``OneDNNLinear``, so the state dict
keeps its keys here too. A weight whose
module holds anything else is left alone with a note. On both frontends the
packed weight is derived when the artifact is loaded, never saved: an opaque
oneDNN tensor can be neither saved nor copied.

Math: ``act(x W^T + b)`` either way. ``OneDNNLinear`` computes it with oneDNN's
inner product on a weight reordered once into its blocked layout, with the
activation applied in the kernel's epilogue; ``F.linear`` runs MKL's GEMM. The
two sum in a different order, so the results agree up to float rounding
(about 1e-6 relative in float32), not bit for bit. Off CPU, for other dtypes
or when oneDNN is unavailable, ``OneDNNLinear`` runs ``F.linear`` + ``act``.

Left alone, with a note: subclasses of ``nn.Linear`` and layers with hooks,
layers whose weights are not float32/bfloat16 or not on the CPU, and unusual
call arguments. A layer called at several sites is converted without fusing
an activation (the activation differs per site).

Why on ATen graphs too: a decoder's step at batch 1 is one row per GEMM, where
the time is reading the weights. Run over all the weights of ``recipes/llama.yaml``
in turn (so each comes from memory, as in a decode step), ``F.linear`` took 8.5 ms
and the packed oneDNN GEMMs 3.9 ms (2 threads, AMD EPYC).

``reverse`` puts an ``nn.Linear`` sharing the same Parameters back at each path
(ATen graphs: a plain module holding them, read by ``aten.linear``) and re-inserts a
fused activation as its functional form (``F.gelu(h, approximate=...)``,
``aten.gelu``, ...), which computes the same as the module it came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.fx import GraphModule, Node

from aot.runtime.onednn_linear import OneDNNLinear

from ._aten_linear_layers import HeldLayer, aten_call_sites, aten_linear_instead, call_holder_instead, held_layer, infer_reads, restored_holder
from ._layers import call_sites
from ._modules import delete_if_unreferenced, set_submodule
from ._nodes import called_on_one_input, inherit_provenance
from .base import ReversibleTransformation
from .registry import register_pass
from .rule import Match, RewriteRule

_F = nn.functional
_aten = torch.ops.aten
_CONV1D = "transformers.pytorch_utils.Conv1D"  # GPT-2's transposed linear, a leaf of the fx frontend
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# activation -> how reverse writes it back: (function, keyword arguments)
_FUNCTIONAL_FORM = {
    "gelu": (_F.gelu, {}),
    "gelu_tanh": (_F.gelu, {"approximate": "tanh"}),
    "relu": (_F.relu, {}),
}
_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}
_ATEN_FORM = {
    "gelu": (_aten.gelu.default, {}),
    "gelu_tanh": (_aten.gelu.default, {"approximate": "tanh"}),
    "relu": (_aten.relu.default, {}),
}


@dataclass
class _Layer:
    """An nn.Linear and its call sites: one module, so packed once for all of them.

    On ATen graphs: ``aten.linear``/``aten.addmm`` calls reading one ``get_attr`` weight, and
    ``target`` the module holding that weight (where the OneDNNLinear goes).
    """

    target: str
    nodes: list[Node]
    aten: bool = False
    conv1d: bool = False  # fx: a transformers Conv1D leaf, whose weight is (in, out)
    held: HeldLayer | None = None  # ATen graphs: what check found the holder holds, for rewrite


@register_pass("prepack_linear_weights")
class PrepackLinearWeights(RewriteRule, ReversibleTransformation):
    """Runs linear layers (nn.Linear; aten.linear/addmm on weights) on pre-packed oneDNN weights, fusing a GELU/ReLU that follows."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        fuse_activation: bool = Field(default=True, description="Fuse a GELU or ReLU that is the only user of a linear's output into it.")
        batch_size_hint: int = Field(
            default=128, ge=1, description="Rows (batch x sequence) the packed weight layout is tuned for; any row count gives the same result."
        )

    # -- matching ----------------------------------------------------------------------

    def candidates(self, graph_module: GraphModule) -> Iterator[Match[_Layer]]:
        """Each nn.Linear with all its call sites.

        A layer called at several sites keeps the activations after it: a near
        miss of the pattern "linear, then its activation", noted.
        """
        layers = [_Layer(target, nodes) for target, nodes in call_sites(graph_module, nn.Linear).items()]
        layers += [_Layer(target, nodes, conv1d=True) for target, nodes in call_sites(graph_module, nn.Module).items()
                   if torch.typename(graph_module.get_submodule(target)) == _CONV1D]
        layers += [_Layer(target, nodes, aten=True) for target, nodes in aten_call_sites(graph_module).items()]
        for layer in layers:
            nodes = layer.nodes
            if len(nodes) > 1 and self.options.fuse_activation and any(_activation_after(graph_module, node) for node in nodes):
                yield Match.fail(f"'{layer.target}' is called at {len(nodes)} sites, its activation is not fused", node=nodes[0])
            yield Match.ok(layer, sites=len(nodes))

    def check(self, graph_module: GraphModule, layer: _Layer) -> Match[_Layer]:
        """Whether the layer may become a OneDNNLinear."""
        where = f"layer '{layer.target}' ({', '.join(node.name for node in layer.nodes)})"
        if layer.aten:
            held = held_layer(graph_module, layer.target, layer.nodes)
            if not held:
                return Match.fail(f"{where}: {held.reason}")
            layer.held = held.value  # rewrite packs this one: a Conv1D weight's (out, in) copy is made once
            weight, bias = held.value.weight, held.value.bias
        else:
            module = graph_module.get_submodule(layer.target)
            if (type(module) is not nn.Linear and not layer.conv1d) or module._forward_hooks or module._forward_pre_hooks:
                return Match.fail(f"{where}: the layer is a subclass of nn.Linear or has hooks")
            if not all(called_on_one_input(node) for node in layer.nodes):
                return Match.fail(f"{where}: unexpected call arguments at one of the layer's call sites")
            weight, bias = module.weight, module.bias
        if weight.dtype not in _PACKABLE_DTYPES or (bias is not None and bias.dtype != weight.dtype):
            return Match.fail(f"{where}: weights are {weight.dtype}, oneDNN packing is for float32/bfloat16")
        if weight.device.type != "cpu":
            return Match.fail(f"{where}: weights are on {weight.device}, oneDNN packing is for the CPU")
        return Match.ok(layer)

    # -- rewriting ---------------------------------------------------------------------

    def rewrite(self, graph_module: GraphModule, layer: _Layer) -> None:
        target = layer.target
        fused = self._activation_to_fuse(graph_module, layer)
        activation = fused.value[1] if fused else "none"
        transposed = False
        if layer.aten:
            packed, transposed = OneDNNLinear.from_linear(layer.held, activation, self.options.batch_size_hint), layer.held.transposed
            nodes = [call_holder_instead(graph_module, node, target) for node in layer.nodes]
        elif layer.conv1d:  # x W + b with W (in, out): the linear layer of W^T, copied once into that layout
            module = graph_module.get_submodule(target)
            weight = nn.Parameter(module.weight.detach().t().contiguous(), requires_grad=module.weight.requires_grad)
            packed, transposed = OneDNNLinear.from_linear(HeldLayer(weight, module.bias, True), activation, self.options.batch_size_hint), True
            nodes = layer.nodes
        else:
            packed = OneDNNLinear.from_linear(graph_module.get_submodule(target), activation, self.options.batch_size_hint)
            nodes = layer.nodes
        set_submodule(graph_module, target, packed)
        if fused:
            self._fuse(graph_module, nodes[0], fused.value[0])
        for node in nodes:
            self.mark_as_transformed(node)
            self.save_reverse_info(node, {"activation": activation, "aten": layer.aten, "transposed": transposed})

    def _activation_to_fuse(self, graph_module: GraphModule, layer: _Layer) -> Match[tuple[Node, str]]:
        if not self.options.fuse_activation:
            return Match.fail("fuse_activation is off")
        if len(layer.nodes) > 1:  # one module, one activation: it would differ between the sites
            return Match.fail(f"'{layer.target}' is called at {len(layer.nodes)} sites")
        return _activation_after(graph_module, layer.nodes[0])

    def _fuse(self, graph_module: GraphModule, node: Node, activation_node: Node) -> None:
        if "val" in activation_node.meta:
            node.meta["val"] = activation_node.meta["val"]
        activation_node.replace_all_uses_with(node)
        graph_module.graph.erase_node(activation_node)
        if activation_node.op == "call_module":
            delete_if_unreferenced(graph_module, str(activation_node.target))

    # -- reverse -----------------------------------------------------------------------

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        graph = graph_module.graph
        for node in self.get_transformed_nodes(graph_module):
            info = self.reverse_info(node)
            activation, aten = info["activation"], info.get("aten", False)
            target = str(node.target)
            layer = graph_module.get_submodule(target)
            transposed = info.get("transposed", False)
            if aten:
                node = aten_linear_instead(graph_module, node, layer, transposed)
            if isinstance(layer, OneDNNLinear):  # a layer called at several sites is put back once
                restored = restored_holder(layer, transposed) if aten else _conv1d_of(layer) if transposed else _linear_sharing(layer)
                set_submodule(graph_module, target, restored)
            if aten:
                infer_reads(graph_module, node)
            if activation != "none":
                function, kwargs = (_ATEN_FORM if aten else _FUNCTIONAL_FORM)[activation]
                users = list(node.users)
                with graph.inserting_after(node):
                    activation_node = graph.call_function(function, (node,), dict(kwargs))
                inherit_provenance(node, activation_node)
                if "val" in node.meta:
                    activation_node.meta["val"] = node.meta["val"]
                for user in users:
                    user.replace_input_with(node, activation_node)
            self.mark_as_restored(node)
        return graph_module


def _activation_after(graph_module: GraphModule, node: Node) -> Match[tuple[Node, str]]:
    """The activation node that is the only reader of ``node``, and its OneDNNLinear name."""
    if len(node.users) != 1:
        return Match.fail(f"read by {len(node.users)} nodes, not by an activation alone", node=node)
    user = next(iter(node.users))
    activation = _activation_of(graph_module, user, node)
    return Match.ok((user, activation.value)) if activation else activation


def _activation_of(graph_module: GraphModule, user: Node, source: Node) -> Match[str]:
    """The OneDNNLinear activation ``user`` applies to ``source``, if it is one that fuses."""
    args, kwargs = list(user.args), dict(user.kwargs)
    not_fusable = Match.fail("not a GELU or ReLU that fuses", node=user)
    if not args or args[0] is not source:
        return not_fusable
    if user.op == "call_module":
        module = graph_module.get_submodule(str(user.target))
        if len(args) != 1 or kwargs or module._forward_hooks or module._forward_pre_hooks:
            return not_fusable
        if type(module) is nn.GELU:
            return _gelu(module.approximate, user)
        if type(module) is nn.ReLU:
            return Match.ok("relu")
        if type(module).__name__ == "GELUActivation" and getattr(module, "act", None) is _F.gelu:
            return Match.ok("gelu")  # transformers.activations.GELUActivation, when traced as a leaf
        return not_fusable
    if user.op == "call_function" and user.target is _F.gelu:  # also torch._C._nn.gelu, the same object
        approximate = args[1] if len(args) > 1 else kwargs.pop("approximate", "none")
        if len(args) > 2 or set(kwargs) - {"approximate"}:
            return not_fusable
        return _gelu(approximate, user)
    if user.op == "call_function" and user.target is _aten.gelu.default:
        approximate = kwargs.pop("approximate", "none")
        return _gelu(approximate, user) if len(args) == 1 and not kwargs else not_fusable
    if user.op == "call_function" and user.target is _aten.relu.default:
        return Match.ok("relu") if len(args) == 1 and not kwargs else not_fusable
    if (user.op == "call_function" and user.target in (_F.relu, torch.relu)) or (user.op == "call_method" and user.target == "relu"):
        inplace = args[1] if len(args) > 1 else kwargs.pop("inplace", False)
        return Match.ok("relu") if len(args) <= 2 and not kwargs and isinstance(inplace, bool) else not_fusable
    return not_fusable


def _gelu(approximate: Any, node: Node) -> Match[str]:
    if isinstance(approximate, str) and approximate in _APPROXIMATE:
        return Match.ok(_APPROXIMATE[approximate])
    return Match.fail(f"GELU with approximate={approximate!r}", node=node)


def _linear_sharing(packed: OneDNNLinear) -> nn.Linear:
    layer = nn.utils.skip_init(nn.Linear, packed.in_features, packed.out_features, bias=packed.bias is not None, device="meta")
    layer.weight = packed.weight
    layer.bias = packed.bias
    return layer



def _conv1d_of(packed: OneDNNLinear) -> nn.Module:
    """transformers' Conv1D again, its weight transposed back to (in, out), its bias shared."""
    from transformers.pytorch_utils import Conv1D

    layer = Conv1D(packed.out_features, packed.in_features)
    layer.weight = nn.Parameter(packed.weight.detach().t().contiguous(), requires_grad=packed.weight.requires_grad)
    layer.bias = packed.bias
    return layer
