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

from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ._batch_norm import BatchNorm, BatchNormFusion
from ._layers import LayerParameters, layer_parameters, set_layer_parameters
from ._nodes import tensor_val
from .registry import register_pass
from .rule import Match

_aten = torch.ops.aten


@dataclass
class _LinearBatchNorm:
    batch_norm: BatchNorm
    linear: Node
    weight: torch.Tensor
    bias: torch.Tensor | None
    linear_first: bool  # Linear -> BN, else BN -> Linear


@register_pass("fuse_batch_norm_1d_in_linear")
class FuseBatchNorm1dInLinear(BatchNormFusion):
    """Fuses an inference-mode BatchNorm1d into the Linear before or after it."""

    batch_norm_class = nn.BatchNorm1d

    def check_layer(self, graph_module: GraphModule, batch_norm: BatchNorm) -> Match[_LinearBatchNorm]:
        val = tensor_val(batch_norm.input)
        if val is None or val.dim() != 2:
            return Match.fail(f"'{batch_norm.node.name}': input not known to be 2-D (rank {None if val is None else val.dim()})")
        before = batch_norm.input
        parameters = _linear_parameters(graph_module, before)
        if parameters and len(before.users) == 1:
            return Match.ok(_LinearBatchNorm(batch_norm, before, *parameters.value, linear_first=True))
        not_between = Match.fail(f"'{batch_norm.node.name}' is not the sole link between a Linear and its neighbour")
        users = list(batch_norm.output.users)
        if len(users) != 1:
            return not_between
        after = users[0]
        parameters = _linear_parameters(graph_module, after)
        if not parameters or after.args[0] is not batch_norm.output:
            return not_between
        return Match.ok(_LinearBatchNorm(batch_norm, after, *parameters.value, linear_first=False))

    def rewrite(self, graph_module: GraphModule, fusion: _LinearBatchNorm) -> None:
        batch_norm, linear, weight, bias = fusion.batch_norm, fusion.linear, fusion.weight, fusion.bias
        scale, shift = batch_norm.scale, batch_norm.shift
        if fusion.linear_first:
            bias64 = bias.detach().double() if bias is not None else torch.zeros_like(scale)
            new_weight = weight.detach().double() * scale[:, None]
            new_bias = bias64 * scale + shift
            batch_norm.output.replace_all_uses_with(linear)
        else:
            bias64 = bias.detach().double() if bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)
            new_weight = weight.detach().double() * scale[None, :]
            new_bias = weight.detach().double() @ shift + bias64
            linear.replace_input_with(batch_norm.output, batch_norm.input)
        set_layer_parameters(graph_module, linear, new_weight.to(weight.dtype), new_bias.to(weight.dtype), "bn_fused")
        self.mark_as_transformed(linear)
        batch_norm.erase(graph_module)


def _linear_parameters(graph_module: GraphModule, node: Node) -> Match[LayerParameters]:
    return layer_parameters(graph_module, node, nn.Linear, (_aten.linear.default,))
