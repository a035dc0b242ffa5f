"""FuseBatchNorm1dInLinear: fold an inference-mode BatchNorm1d into an adjacent Linear.

Matches either order, on 2-D activations ``(N, C)``::

    y = self.bn(self.fc(x))     # Linear -> BatchNorm1d
    y = self.fc(self.bn(x))     # BatchNorm1d -> Linear

(``export`` frontend: ``aten.linear`` next to ``aten.batch_norm`` or
``aten._native_batch_norm_legit_no_training``.)

Rewrites to::

    y = self.fc(x)              # nn.Linear with weight W', bias b'

Math, with ``s = γ / sqrt(σ² + ε)`` and ``t = β − μ · s`` (``γ = 1, β = 0`` when
``affine=False``)::

    Linear -> BN:  W' = diag(s) · W      b' = s ⊙ b + t  = (b − μ) · s + β
    BN -> Linear:  W' = W · diag(s)      b' = W · t + b

computed in float64, stored in the layer's dtype.

Left alone, with a note: a batch norm in training mode or with
``track_running_stats=False``; activations that are not known to be 2-D (on
``(N, C, L)`` BatchNorm1d normalises dimension 1, not the features); an
intermediate output read by another node. A Linear module called elsewhere
keeps its parameters: the fused copy gets a new name.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._batch_norm import BatchNorm, BatchNormFusion
from ._layers import set_layer_parameters
from ._modules import get_attribute
from ._nodes import tensor_val
from .registry import register_pass

_aten = torch.ops.aten


@register_pass("fuse_batch_norm_1d_in_linear")
class FuseBatchNorm1dInLinear(BatchNormFusion):
    """Fuses an inference-mode BatchNorm1d into the Linear before or after it."""

    batch_norm_class = nn.BatchNorm1d

    def _fuse(self, graph_module: GraphModule, batch_norm: BatchNorm) -> str | None:
        val = tensor_val(batch_norm.input)
        if val is None or val.dim() != 2:
            return f"'{batch_norm.node.name}': input not known to be 2-D (rank {None if val is None else val.dim()})"
        scale, shift = batch_norm.scale, batch_norm.shift
        before = batch_norm.input
        if _linear_parameters(graph_module, before) is not None and len(before.users) == 1:
            weight, bias = _linear_parameters(graph_module, before)
            bias64 = bias.detach().double() if bias is not None else torch.zeros_like(scale)
            new_weight = weight.detach().double() * scale[:, None]
            new_bias = bias64 * scale + shift
            linear = before
            batch_norm.output.replace_all_uses_with(linear)
        else:
            users = list(batch_norm.output.users)
            after = users[0] if len(users) == 1 else None
            parameters = _linear_parameters(graph_module, after) if after is not None else None
            if parameters is None or after.args[0] is not batch_norm.output:
                return f"'{batch_norm.node.name}' is not the sole link between a Linear and its neighbour"
            weight, bias = parameters
            bias64 = bias.detach().double() if bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)
            new_weight = weight.detach().double() * scale[None, :]
            new_bias = weight.detach().double() @ shift + bias64
            linear = after
            linear.replace_input_with(batch_norm.output, batch_norm.input)
        set_layer_parameters(graph_module, linear, new_weight.to(weight.dtype), new_bias.to(weight.dtype), "bn_fused")
        self.mark_as_transformed(linear)
        batch_norm.erase(graph_module)
        return None


def _linear_parameters(graph_module: GraphModule, node: Node):
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if type(module) is not nn.Linear or len(node.args) != 1 or node.kwargs:
            return None
        return module.weight, module.bias
    if node.op != "call_function" or node.target is not _aten.linear.default or node.kwargs:
        return None
    weight = node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    if not _is_get_attr(weight) or not (bias is None or _is_get_attr(bias)):
        return None
    return get_attribute(graph_module, str(weight.target)), get_attribute(graph_module, str(bias.target)) if bias is not None else None


def _is_get_attr(value) -> bool:
    return isinstance(value, Node) and value.op == "get_attr"
