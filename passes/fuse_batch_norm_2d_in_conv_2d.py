"""FuseBatchNorm2dInConv2d: fold an inference-mode BatchNorm2d into the Conv2d before it.

Matches::

    y = self.conv(x)            # nn.Conv2d, weight W, bias b (0 if none)
    z = self.bn(y)              # nn.BatchNorm2d in eval mode, with running statistics

(``export`` frontend: ``aten.conv2d`` / ``aten.convolution`` followed by
``aten.batch_norm`` or ``aten._native_batch_norm_legit_no_training``.)

Rewrites to::

    z = self.conv(x)            # nn.Conv2d with weight W', bias b'

Math, per output channel ``c`` with ``s = γ / sqrt(σ² + ε)``::

    W'[c] = W[c] · s[c]
    b'[c] = (b[c] − μ[c]) · s[c] + β[c]

with ``γ = 1, β = 0`` when ``affine=False``; computed in float64, stored in the conv's dtype.

Left alone, with a note: a batch norm in training mode or with
``track_running_stats=False`` (it uses batch statistics), and a conv whose output
is also read by another node. A conv module called elsewhere is not changed:
the fused copy gets a new name. The caller's modules are never modified.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._batch_norm import BatchNorm, BatchNormFusion
from ._layers import set_layer_parameters
from ._modules import get_attribute
from .registry import register_pass

_aten = torch.ops.aten
_CONV_OPS = (_aten.conv2d.default, _aten.conv2d.padding, _aten.convolution.default)


@register_pass("fuse_batch_norm_2d_in_conv_2d")
class FuseBatchNorm2dInConv2d(BatchNormFusion):
    """Fuses an inference-mode BatchNorm2d into the Conv2d that feeds it."""

    batch_norm_class = nn.BatchNorm2d

    def _fuse(self, graph_module: GraphModule, batch_norm: BatchNorm) -> str | None:
        conv = batch_norm.input
        weight_bias = _conv_parameters(graph_module, conv)
        if weight_bias is None:
            return f"'{batch_norm.node.name}' does not follow a Conv2d"
        if len(conv.users) != 1:
            return f"conv '{conv.name}' output is also read by {', '.join(u.name for u in conv.users if u is not batch_norm.node)}"
        weight, bias = weight_bias
        scale, shift = batch_norm.scale, batch_norm.shift
        bias64 = bias.detach().double() if bias is not None else torch.zeros_like(scale)
        new_weight = (weight.detach().double() * scale.reshape(-1, 1, 1, 1)).to(weight.dtype)
        new_bias = (bias64 * scale + shift).to(weight.dtype)
        set_layer_parameters(graph_module, conv, new_weight, new_bias, "bn_fused")
        self.mark_as_transformed(conv)
        batch_norm.output.replace_all_uses_with(conv)
        batch_norm.erase(graph_module)
        return None


def _conv_parameters(graph_module: GraphModule, node: Node):
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if type(module) is not nn.Conv2d or len(node.args) != 1 or node.kwargs:
            return None
        return module.weight, module.bias
    if node.op != "call_function" or node.target not in _CONV_OPS:
        return None
    if node.target is _aten.convolution.default and node.args[6]:
        return None  # transposed
    weight = node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if node.kwargs or not _is_get_attr(weight) or not (bias is None or _is_get_attr(bias)):
        return None
    weight_t = get_attribute(graph_module, str(weight.target))
    if weight_t.dim() != 4:
        return None
    return weight_t, get_attribute(graph_module, str(bias.target)) if bias is not None else None


def _is_get_attr(value) -> bool:
    return isinstance(value, Node) and value.op == "get_attr"
