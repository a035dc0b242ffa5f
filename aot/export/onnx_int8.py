"""The ONNX form of ``aot.runtime.Int8DynamicLinear``: ONNX's int8 ops, ``MatMulInteger`` at the core.

``torch.export`` traces an ``Int8DynamicLinear`` into float ops (its formula, see
:mod:`aot.runtime.int8_linear`), which ONNX Runtime would run in float. So before the
ONNX export, each call of one becomes a call of a custom op on a copy of the graph,
``aot::int8_dynamic_linear`` or ``aot::int8_per_token_linear`` (input, weight,
weight_scale, bias), which the exporter translates into standard ONNX ops.

Per tensor::

    x_q, a, z = DynamicQuantizeLinear(x)                     # uint8, one scale and zero point
    acc       = MatMulInteger(x_q, q^T, z)                   # int32; q^T an int8 initializer (in, out)
    y         = Cast(acc, float) * (a * s) + b               # s: per-output-channel float scales

which is the graph ONNX Runtime's own ``quantize_dynamic`` writes, so ONNX Runtime fuses
it at load into its int8 kernel (``DynamicQuantizeMatMul``). Per token, the rounded value shifted by 128 into uint8, so that every row shares one zero point::

    a   = max(ReduceMax(Abs(x), axis -1), tiny) / 127        # one step a row
    x_q = Cast(Round(x · (1 / a)) + 128, uint8)              # in [1, 255]
    y   = Cast(MatMulInteger(x_q, q^T, 128), float) * a * s + b

The weights and scales are the very tensors of the saved GraphModule: both artifacts
carry one quantisation.
"""

from __future__ import annotations

import torch
import torch.fx

from aot.runtime.int8_linear import Int8DynamicLinear, _int8_fake_quantized_activation, _int8_per_token_activation

_OP_NAME = "aot::int8_dynamic_linear"


@torch.library.custom_op(_OP_NAME, mutates_args=())
def int8_dynamic_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``Int8DynamicLinear``'s formula as one op: what the exporter sees and translates."""
    dequantized = weight.float() * weight_scale[:, None]
    return torch.nn.functional.linear(_int8_fake_quantized_activation(input), dequantized, bias)


def _linear_output_shape(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


int8_dynamic_linear.register_fake(_linear_output_shape)


@torch.library.custom_op("aot::int8_per_token_linear", mutates_args=())
def int8_per_token_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``Int8DynamicLinear(activations="per_token")``'s formula as one op."""
    dequantized = weight.float() * weight_scale[:, None]
    return torch.nn.functional.linear(_int8_per_token_activation(input), dequantized, bias)


int8_per_token_linear.register_fake(_linear_output_shape)


def _onnx_int8_dynamic_linear(input, weight, weight_scale, bias=None):
    from onnxscript import opset18 as op

    quantized, scale, zero_point = op.DynamicQuantizeLinear(input)
    weight_in_out = op.Transpose(weight, perm=[1, 0])  # an initializer: the exporter folds the transpose
    accumulated = op.MatMulInteger(quantized, weight_in_out, zero_point)
    output = op.Mul(op.Cast(accumulated, to=1), op.Mul(scale, weight_scale))  # to=1: FLOAT
    return output if bias is None else op.Add(output, bias)


def _onnx_int8_per_token_linear(input, weight, weight_scale, bias=None):
    from onnxscript import opset18 as op

    largest = op.Max(op.ReduceMax(op.Abs(input), op.Constant(value_ints=[-1]), keepdims=1), op.Constant(value_float=1e-30))
    step = op.Div(largest, op.Constant(value_float=127.0))
    # round(x · (127 / max)), as the torch kernel computes it, so that ties round alike
    rounded = op.Round(op.Mul(input, op.Div(op.Constant(value_float=127.0), largest)))
    shifted = op.Cast(op.Add(rounded, op.Constant(value_float=128.0)), to=2)  # UINT8
    zero_point = op.Cast(op.Constant(value_float=128.0), to=2)  # UINT8, folded to a constant
    accumulated = op.MatMulInteger(shifted, op.Transpose(weight, perm=[1, 0]), zero_point)
    output = op.Mul(op.Mul(op.Cast(accumulated, to=1), step), weight_scale)  # to=1: FLOAT
    return output if bias is None else op.Add(output, bias)


_CUSTOM_OPS = {
    "per_tensor": (torch.ops.aot.int8_dynamic_linear.default, _onnx_int8_dynamic_linear),
    "per_token": (torch.ops.aot.int8_per_token_linear.default, _onnx_int8_per_token_linear),
}


def lower_int8_linears(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict]:
    """``gm`` with each Int8DynamicLinear call as the custom op, and the exporter's translation table for it.

    The graph is copied; ``gm`` and its modules are left as they are. A graph without
    int8 layers comes back unchanged, with an empty table.
    """
    if not int8_linear_calls(gm):
        return gm, {}
    lowered = torch.fx.GraphModule(gm, copied_graph(gm.graph))
    graph = lowered.graph
    for node in int8_linear_calls(lowered):
        layer = lowered.get_submodule(str(node.target))
        with graph.inserting_before(node):
            tensors = [graph.get_attr(f"{node.target}.{name}") for name in ("weight", "weight_scale")]
            bias = graph.get_attr(f"{node.target}.bias") if layer.bias is not None else None
            operator = _CUSTOM_OPS[layer.activations][0]
            call = graph.call_function(operator, (node.args[0] if node.args else node.kwargs["input"], *tensors, bias))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
    lowered.recompile()
    return lowered, dict(_CUSTOM_OPS.values())


def int8_linear_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The calls of an ``Int8DynamicLinear`` in ``gm``: what :func:`lower_int8_linears` replaces."""
    return [node for node in gm.graph.nodes if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), Int8DynamicLinear)]


def copied_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` (nodes, output and code generator) to rewrite without touching the original."""
    copy = torch.fx.Graph(owning_module=graph.owning_module, tracer_cls=graph._tracer_cls)
    output = copy.graph_copy(graph, {})
    copy.output(output)
    copy._codegen = graph._codegen
    return copy
