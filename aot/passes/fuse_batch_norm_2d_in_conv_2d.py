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

from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._batch_norm import BatchNorm, BatchNormFusion
from ._layers import LayerParameters, layer_parameters, set_layer_parameters
from .registry import register_pass
from .rule import Match

_aten = torch.ops.aten
_CONV_OPS = (_aten.conv2d.default, _aten.conv2d.padding, _aten.convolution.default)


@dataclass
class _ConvBatchNorm:
    batch_norm: BatchNorm
    conv: Node
    weight: torch.Tensor
    bias: torch.Tensor | None


@register_pass("fuse_batch_norm_2d_in_conv_2d")
class FuseBatchNorm2dInConv2d(BatchNormFusion):
    """Fuses an inference-mode BatchNorm2d into the Conv2d that feeds it."""

    batch_norm_class = nn.BatchNorm2d

    def check_layer(self, graph_module: GraphModule, batch_norm: BatchNorm) -> Match[_ConvBatchNorm]:
        conv = batch_norm.input
        parameters = _conv_2d_parameters(graph_module, conv)
        if not parameters:
            return Match.fail(f"'{batch_norm.node.name}' does not follow a Conv2d ({parameters.reason})")
        if len(conv.users) != 1:
            readers = ", ".join(user.name for user in conv.users if user is not batch_norm.node)
            return Match.fail(f"conv '{conv.name}' output is also read by {readers}")
        return Match.ok(_ConvBatchNorm(batch_norm, conv, *parameters.value))

    def rewrite(self, graph_module: GraphModule, fusion: _ConvBatchNorm) -> None:
        weight, bias, conv = fusion.weight, fusion.bias, fusion.conv
        scale, shift = fusion.batch_norm.scale, fusion.batch_norm.shift
        bias64 = bias.detach().double() if bias is not None else torch.zeros_like(scale)
        new_weight = (weight.detach().double() * scale.reshape(-1, 1, 1, 1)).to(weight.dtype)
        new_bias = (bias64 * scale + shift).to(weight.dtype)
        set_layer_parameters(graph_module, conv, new_weight, new_bias, "bn_fused")
        self.mark_as_transformed(conv)
        fusion.batch_norm.output.replace_all_uses_with(conv)
        fusion.batch_norm.erase(graph_module)


def _conv_2d_parameters(graph_module: GraphModule, node: Node) -> Match[LayerParameters]:
    if node.op == "call_function" and node.target is _aten.convolution.default and node.args[6]:
        return Match.fail("a transposed convolution", node=node)
    parameters = layer_parameters(graph_module, node, nn.Conv2d, _CONV_OPS)
    if parameters and parameters.value[0].dim() != 4:
        return Match.fail("not a 2-D convolution", node=node)
    return parameters
