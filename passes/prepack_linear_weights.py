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

``reverse`` puts an ``nn.Linear`` sharing the same Parameters back at each path
and re-inserts a fused activation as its functional form (``F.gelu(h,
approximate=...)`` or ``F.relu(h)``), which computes the same as the module it
came from. Only the ``fx`` frontend: on ATen graphs the packed weight would be
an opaque oneDNN tensor that cannot be saved or copied.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.fx import GraphModule, Node

from aot.runtime.onednn_linear import OneDNNLinear

from ._modules import delete_if_unreferenced, set_submodule
from ._nodes import inherit_provenance
from .base import ReversibleTransformation
from .registry import register_pass

_F = nn.functional
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# activation -> how reverse writes it back: (function, keyword arguments)
_FUNCTIONAL_FORM = {
    "gelu": (_F.gelu, {}),
    "gelu_tanh": (_F.gelu, {"approximate": "tanh"}),
    "relu": (_F.relu, {}),
}
_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


@register_pass("prepack_linear_weights", frontends=("fx",))
class PrepackLinearWeights(ReversibleTransformation):
    """Runs nn.Linear layers on pre-packed oneDNN weights, fusing a GELU/ReLU that follows."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        fuse_activation: bool = Field(default=True, description="Fuse a GELU or ReLU that is the only user of a linear's output into it.")
        batch_size_hint: int = Field(
            default=128, ge=1, description="Rows (batch x sequence) the packed weight layout is tuned for; any row count gives the same result."
        )

    def transform(self, graph_module: GraphModule) -> GraphModule:
        sites: dict[str, list[Node]] = {}
        for node in graph_module.graph.nodes:
            if node.op == "call_module" and isinstance(graph_module.get_submodule(str(node.target)), nn.Linear):
                sites.setdefault(str(node.target), []).append(node)
        for target, nodes in sites.items():
            self.report.matched += len(nodes)
            reason = self._reason_to_skip(graph_module.get_submodule(target), nodes)
            if reason:
                for node in nodes:
                    self.note(f"node '{node.name}': {reason}")
                continue
            fused = self._fusable_activation(graph_module, nodes)
            activation = "none" if fused is None else fused[1]
            set_submodule(graph_module, target, OneDNNLinear.from_linear(graph_module.get_submodule(target), activation, self.options.batch_size_hint))
            if fused is not None:
                self._fuse(graph_module, nodes[0], fused[0])
            for node in nodes:
                self.mark_as_transformed(node)
                self.save_reverse_info(node, {"activation": activation})
            self.report.changed += len(nodes)
        return graph_module

    # -- matching ----------------------------------------------------------------------

    def _reason_to_skip(self, layer: nn.Linear, nodes: list[Node]) -> str:
        """Why the layer called by ``nodes`` must stay an nn.Linear, or "" if it may be packed."""
        if type(layer) is not nn.Linear or layer._forward_hooks or layer._forward_pre_hooks:
            return "the layer is a subclass of nn.Linear or has hooks"
        if any(_input(node) is None for node in nodes):
            return "unexpected call arguments at one of the layer's call sites"
        if layer.weight.dtype not in _PACKABLE_DTYPES or (layer.bias is not None and layer.bias.dtype != layer.weight.dtype):
            return f"weights are {layer.weight.dtype}, oneDNN packing is for float32/bfloat16"
        if layer.weight.device.type != "cpu":
            return f"weights are on {layer.weight.device}, oneDNN packing is for the CPU"
        return ""

    def _fusable_activation(self, graph_module: GraphModule, nodes: list[Node]) -> tuple[Node, str] | None:
        """The activation node that is the only user of the layer's output, and its OneDNNLinear name."""
        fusable = []
        for node in nodes:
            if self.options.fuse_activation and len(node.users) == 1:
                activation = _activation_of(graph_module, next(iter(node.users)), node)
                if activation is not None:
                    fusable.append((next(iter(node.users)), activation))
        if not fusable:
            return None
        if len(nodes) > 1:  # one module, one activation: it would differ between the sites
            self.note(f"node '{nodes[0].name}': '{nodes[0].target}' is called at {len(nodes)} sites, its activation is not fused")
            return None
        return fusable[0]

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
            activation = self.reverse_info(node)["activation"]
            target = str(node.target)
            layer = graph_module.get_submodule(target)
            if isinstance(layer, OneDNNLinear):  # a layer called at several sites is put back once
                set_submodule(graph_module, target, _linear_sharing(layer))
            if activation != "none":
                function, kwargs = _FUNCTIONAL_FORM[activation]
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


def _input(node: Node) -> Node | None:
    operands = list(node.args) + list(node.kwargs.values())
    if len(operands) != 1 or not isinstance(operands[0], Node) or set(node.kwargs) - {"input"}:
        return None
    return operands[0]


def _activation_of(graph_module: GraphModule, user: Node, source: Node) -> str | None:
    """The OneDNNLinear activation ``user`` applies to ``source``, or None if it is not one that fuses."""
    args, kwargs = list(user.args), dict(user.kwargs)
    if not args or args[0] is not source:
        return None
    if user.op == "call_module":
        module = graph_module.get_submodule(str(user.target))
        if len(args) != 1 or kwargs or module._forward_hooks or module._forward_pre_hooks:
            return None
        if type(module) is nn.GELU:
            return _APPROXIMATE.get(module.approximate)
        if type(module) is nn.ReLU:
            return "relu"
        if type(module).__name__ == "GELUActivation" and getattr(module, "act", None) is _F.gelu:
            return "gelu"  # transformers.activations.GELUActivation, when traced as a leaf
        return None
    if user.op == "call_function" and user.target is _F.gelu:  # also torch._C._nn.gelu, the same object
        approximate = args[1] if len(args) > 1 else kwargs.pop("approximate", "none")
        if len(args) > 2 or set(kwargs) - {"approximate"}:
            return None
        return _APPROXIMATE.get(approximate) if isinstance(approximate, str) else None
    if (user.op == "call_function" and user.target in (_F.relu, torch.relu)) or (user.op == "call_method" and user.target == "relu"):
        inplace = args[1] if len(args) > 1 else kwargs.pop("inplace", False)
        return "relu" if len(args) <= 2 and not kwargs and isinstance(inplace, bool) else None
    return None


def _linear_sharing(packed: OneDNNLinear) -> nn.Linear:
    layer = nn.utils.skip_init(nn.Linear, packed.in_features, packed.out_features, bias=packed.bias is not None, device="meta")
    layer.weight = packed.weight
    layer.bias = packed.bias
    return layer
