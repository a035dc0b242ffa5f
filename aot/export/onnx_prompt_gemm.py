"""Int4 weight-only layers in ONNX with a second kernel for prompts: ONNX Runtime's int8 GEMM.

ONNX Runtime's ``MatMulNBits`` reads int4 codes: the fastest kernel for a decode step, whose time is
the time to read the weights. A prompt is bound by arithmetic instead, and there ``MatMulNBits`` (at
``accuracy_level`` 4) is the slower kernel: 13.7 ms for 128 rows through a 2048 x 16384 layer, where
``MatMulInteger`` (uint8 x int8, VNNI) takes 6.8 ms, and 7.5 against 2.8 ms through 8192 x 2048
(2-core AMD EPYC, 2 threads, ONNX Runtime 1.32). So a layer exported with int8 prompts branches on
the number of rows it is called with, as ``WeightOnlyLinear`` does in the GraphModule::

    y = If(rows(x) > 8,                                                (rows: the product of x's leading dims)
           then: x_out = each row's 8 largest |x|, x_in the rest        (TopK(Abs(x)); ScatterElements zeros)
                 a = max(|x_in,r|) / 127, b = max(|x_r|) / 127 per row  (ReduceMax(Abs(x_in)); TopK's first; at least 1e-30)
                 x8 = Cast(Round(x_in / a) + 128, uint8)               (|x_in / a| <= 127: zero point 128)
                 y = (Cast(MatMulInteger(x8, W8, 128), float) · a      (W8: int8 (K, N), c: (N,))
                      + Round(x_out / b)[:, U] @ Cast(W8[U], float) · b) · c   (U: the outliers' columns, Unique)
           else: y = MatMulNBits(x, codes, scales[, zero_points]))     (+ bias in both)

Each row on two int8 grids is ``WeightOnlyLinear._int8_product``'s: a decoder's few channels tens of
times larger than the rest, on one grid, would leave the rest a few levels. The outliers' sums
(at most 8 products of int8s each) are exact in float32, so both artifacts compute the same sums.

``W8`` and ``c`` are the int4 layer re-gridded per output channel
(:meth:`aot.runtime.WeightOnlyLinear.int8_regrid`: ``c_n = max_k |(q - z) s|_nk / 127``,
``W8 = round((q - z) s / c)``), the GraphModule's prompt weights, stored beside the codes: a byte a
weight more in the file. They are made as the file is written, one layer at a time (an
``onnx_ir.LazyTensor``), so the export never holds all of them at once.

Both branches read the layer's tensors from the enclosing graph (ONNX's outer scope), so each is
stored once. The row count is computed once for all layers whose inputs have the same dims. Each If
runs its branch as a subgraph: alone, 64 MatMulNBits layers decoded one row in 4.97-4.99 ms inside
Ifs and 4.97-5.02 ms bare, but the 1B Llama's decode step took a median 1.04x its time without them
(0.92-1.13x over 10 alternated builds; 2-core AMD EPYC).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aot.runtime.weight_only_linear import _WO_INT4_KERNEL_ROWS, _WO_OUTLIERS_PER_ROW, _WO_TINY, WeightOnlyLinear

PROMPT_ROWS = _WO_INT4_KERNEL_ROWS  # calls of more rows take the int8 GEMM, as in the GraphModule where the CPU has int8 dot products


def int8_prompt_tensors(layer: WeightOnlyLinear, name: str) -> tuple[ir.Value, ir.Value]:
    """Initializers ``(W8 (K, N) int8, c (N,) float32)`` for ``layer``, ``{name}.weight_int8`` and ``…_scale`` (``name``:
    the layer's path).

    The scales are made now (a pass over the layer, a block of rows at a time), the int8 weight when the
    file is written.
    """
    _, scale = layer.int8_regrid()
    weight = ir.Value(
        name=f"{name}.weight_int8",
        const_value=ir.LazyTensor(lambda: _transposed_codes(layer), dtype=ir.DataType.INT8,
                                  shape=ir.Shape([layer.in_features, layer.out_features]), name=f"{name}.weight_int8"),
    )
    scales = ir.Value(name=f"{name}.weight_int8_scale", const_value=ir.tensor(scale.numpy(), name=f"{name}.weight_int8_scale"))
    for value in (weight, scales):
        value.type, value.shape = ir.TensorType(value.const_value.dtype), value.const_value.shape
    return weight, scales


def _transposed_codes(layer: WeightOnlyLinear) -> ir.Tensor:
    codes, _ = layer.int8_regrid()
    return ir.tensor(np.ascontiguousarray(codes.t().numpy()))


def prompt_and_step_branches(input: ir.Value, step: ir.Node, bias: ir.Value | None, weight8: ir.Value,
                             scale8: ir.Value, name: str) -> tuple[ir.Graph, ir.Graph]:
    """The If's ``(then, else)`` graphs: the int8 GEMM on ``weight8`` and ``scale8`` for a prompt, ``step`` (the
    layer's MatMulNBits node, in no graph yet) for a decode step; ``bias`` added in each."""
    nodes = _Nodes(name)
    out_features = weight8.shape[1]
    rows = nodes.add("Reshape", [input, nodes.constant(np.array([-1, weight8.shape[0]], np.int64))])  # (M, K)
    inliers, outlier_values, outlier_columns, largest = _outliers_apart(nodes, rows, weight8.shape[0])
    inner_largest = nodes.add("ReduceMax", [nodes.add("Abs", [inliers]), nodes.constant(np.array([-1], np.int64))], keepdims=1)
    inner_scale = _row_scale(nodes, inner_largest)
    shifted = nodes.add("Add", [nodes.add("Round", [nodes.add("Div", [inliers, inner_scale])]), nodes.constant(np.array(128, np.float32))])
    codes = nodes.add("Cast", [shifted], to=ir.DataType.UINT8)
    sums = nodes.add("MatMulInteger", [codes, weight8, nodes.constant(np.array(128, np.uint8))])
    outer_scale = _row_scale(nodes, largest)
    outer = nodes.add("Round", [nodes.add("Div", [outlier_values, outer_scale])])
    # the outliers' columns of the int8 weight, each once: Unique over the rows' TopK indices
    columns, _, slots, _ = nodes.add_many("Unique", [nodes.add("Reshape", [outlier_columns, nodes.constant(np.array([-1], np.int64))])],
                                          outputs=4, sorted=1)
    sparse = nodes.add("ScatterElements", [
        nodes.add("ConstantOfShape", [nodes.add("Concat", [nodes.add("Shape", [rows], end=1), nodes.add("Shape", [columns])], axis=0)]),
        nodes.add("Reshape", [slots, nodes.add("Shape", [outlier_columns])]), outer], axis=1)
    met = nodes.add("Cast", [nodes.add("Gather", [weight8, columns], axis=0)], to=ir.DataType.FLOAT)  # (U, N)
    outer_sums = nodes.add("MatMul", [sparse, met])  # at most 8 products of int8 a sum: exact in float32
    both = nodes.add("Add", [nodes.add("Mul", [nodes.add("Cast", [sums], to=ir.DataType.FLOAT), inner_scale]),
                             nodes.add("Mul", [outer_sums, outer_scale])])
    product = nodes.add("Reshape", [nodes.add("Mul", [both, scale8]), nodes.add("Concat", [
        nodes.add("Shape", [input], end=-1), nodes.constant(np.array([out_features], np.int64))], axis=0)])
    if bias is not None:
        product = nodes.add("Add", [product, bias])
    prompt = ir.Graph([], [product], nodes=nodes.taken(), name=f"{name}_prompt")

    step.name, step.outputs[0].name = nodes.fresh_name(), nodes.fresh_name()
    stepped = step.outputs[0]
    if bias is not None:
        stepped = nodes.add("Add", [stepped, bias])
    for output in (product, stepped):  # the If's output type is inferred from its branches'
        output.type = ir.TensorType(ir.DataType.FLOAT)
    return prompt, ir.Graph([], [stepped], nodes=[step, *nodes.taken()], name=f"{name}_step")


def _row_scale(nodes: _Nodes, largest: ir.Value) -> ir.Value:
    """``max(largest_r, 1e-30) / 127`` for each row's largest ``|x|`` (M, 1): the step of the row's int8 grid."""
    return nodes.add("Div", [nodes.add("Max", [largest, nodes.constant(np.array(_WO_TINY, np.float32))]),
                             nodes.constant(np.array(127, np.float32))])


def _outliers_apart(nodes: _Nodes, rows: ir.Value, in_features: int) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """``(x_in, values, columns, largest)`` of ``rows`` (M, K): each row's ``_WO_OUTLIERS_PER_ROW`` largest ``|x|`` (their
    values and columns, (M, k)), the row with zeros in their place (``WeightOnlyLinear._int8_product``'s decomposition)
    and the largest ``|x|`` of each row (M, 1), which TopK sorted first."""
    outliers = min(_WO_OUTLIERS_PER_ROW, in_features)
    magnitudes, columns = nodes.add_many("TopK", [nodes.add("Abs", [rows]), nodes.constant(np.array([outliers], np.int64))],
                                         outputs=2, axis=-1, largest=1, sorted=1)
    values = nodes.add("GatherElements", [rows, columns], axis=1)
    inliers = nodes.add("ScatterElements", [rows, columns, nodes.add("ConstantOfShape", [nodes.add("Shape", [columns])])], axis=1)
    largest = nodes.add("Slice", [magnitudes, *(nodes.constant(np.array([bound], np.int64)) for bound in (0, 1, 1))])  # starts, ends, axes
    return inliers, values, columns, largest


class _Nodes:
    """Nodes made one at a time, each output named ``{prefix}_{n}`` (unique in the model, as ONNX requires)."""

    def __init__(self, prefix: str):
        self.prefix, self.count, self.made = prefix, 0, []

    def add(self, op_type: str, inputs: list[ir.Value], **attributes) -> ir.Value:
        node = ir.node(op_type, inputs, attributes=attributes, name=self.fresh_name())
        node.outputs[0].name = node.name
        self.made.append(node)
        return node.outputs[0]

    def add_many(self, op_type: str, inputs: list[ir.Value], outputs: int, **attributes) -> list[ir.Value]:
        node = ir.node(op_type, inputs, attributes=attributes, num_outputs=outputs, name=self.fresh_name())
        for index, output in enumerate(node.outputs):
            output.name = f"{node.name}_{index}"
        self.made.append(node)
        return list(node.outputs)

    def constant(self, array: np.ndarray) -> ir.Value:
        return self.add("Constant", [], value=ir.tensor(array))

    def taken(self) -> list[ir.Node]:
        made, self.made = self.made, []
        return made

    def fresh_name(self) -> str:
        self.count += 1
        return f"{self.prefix}_{self.count}"
