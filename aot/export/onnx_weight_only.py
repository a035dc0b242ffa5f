"""The ONNX form of ``aot.runtime.WeightOnlyLinear``: ONNX Runtime's ``MatMulNBits`` (com.microsoft).

``torch.export`` traces a ``WeightOnlyLinear`` into its float formula (dequantize, then
``linear``), which ONNX Runtime would run in float on a float weight. So before the ONNX
export each call of one becomes a call of the custom op ``aot::weight_only_linear`` on a
copy of the graph, whose tensors are the layer's own codes laid out as ``MatMulNBits`` reads
them, and the exporter translates the op into::

    y = MatMulNBits(x, B, scales[, zero_points], K=in, N=out, bits, block_size, accuracy_level)  [+ bias]

with ``W ≈ (B - zero_point) · scale`` block by block along ``K``:

- int4: ``B`` is the layer's ``weight`` bytes viewed as ``(N, K / block, block / 2)`` (the same
  bytes: the module stores them in this layout), ``scales`` its ``weight_scale`` flattened,
  ``zero_points`` its ``weight_zero`` two a byte, each row padded to whole bytes (absent when
  symmetric: ``MatMulNBits``'s default zero point is 8);
- int4 with float zero points (``zero_point="float"``): ``MatMulNBits`` runs such zero points by
  dequantizing the whole weight at every call (on a 2-core AMD EPYC, ONNX Runtime 1.32, one row by
  2048 x 8192: 104-131 ms against 1.1-4.4 ms with uint8 zero points). So the layer runs with the default zero point 8 and each
  group's offset ``o = (8 - z) · s`` is added as a product of the input's group sums::

      y = MatMulNBits(x, B, scales) + ReduceSum(x as (..., K / block, block), -1) @ O     O: (K / block, N) float32

  which is ``x ((q - z) s)^T`` exactly, since ``(q - z) s = (q - 8) s + o``; ``O`` is as many bytes as the scales;
- int8 (per output channel): ``B`` is ``q + 128`` as uint8 in blocks of the largest of 256,
  128, 64, 32, 16 that divides ``K``, each row's one scale repeated over its blocks (the default
  zero point, 128, undoes the shift). Exactly the module's ``q · s``. The shifted codes are made
  one layer at a time as the file is written (:func:`shift_int8_codes_on_write`).

``accuracy_level`` follows the layer's ``activations``: ``"int8"`` gives 4, the kernel rounding the
activations to int8 per block (onnxruntime-genai's CPU models use it; the GraphModule rounds them
per token), ``"float"`` gives 0, computing in float32 as the GraphModule then does. The fidelity gate
holds each artifact to the float model on its own.

With ``int8_prompts`` (the recipe's ``export.onnx.int4_prompts: int8_gemm``), an int4 layer at
``accuracy_level`` 4 becomes an If between ``MatMulNBits`` for a decode step and ONNX Runtime's int8
GEMM for a prompt (:mod:`aot.export.onnx_prompt_gemm`); a layer with float zero points stays one
``MatMulNBits`` and its offsets' product for every call.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import onnx_ir as ir
import torch
import torch.fx

from aot.runtime.weight_only_linear import WeightOnlyLinear, wo_pack_int4, wo_unpack_int4

from .onnx_int8 import copied_graph
from .onnx_prompt_gemm import PROMPT_ROWS, int8_prompt_tensors, prompt_and_step_branches

_INT8_BLOCKS = (256, 128, 64, 32, 16)
_ACCURACY_LEVELS = {"int8": 4, "float": 0}  # MatMulNBits' accuracy_level for a layer's activations
_CONTRIB = "com.microsoft"


@torch.library.custom_op("aot::weight_only_linear", mutates_args=())
def weight_only_linear(input: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                       group_offsets: torch.Tensor | None, bias: torch.Tensor | None, in_features: int, out_features: int,
                       bits: int, block_size: int, accuracy_level: int, int8_prompts: int) -> torch.Tensor:
    """``MatMulNBits``'s meaning in torch (``accuracy_level`` and ``int8_prompts`` aside), plus ``group_offsets``
    ``(K / block, N)`` added to each group's weights: what the exporter sees and translates. ``int8_prompts``: -1, or
    the layer's index in the translation's int8-prompt layers."""
    blocks = in_features // block_size
    if bits == 4:
        codes = wo_unpack_int4(weight.reshape(out_features, -1)).float().reshape(out_features, blocks, block_size)
        zero = torch.full((out_features, blocks), 8.0) if zero_points is None else _unpacked_zero_points(zero_points, out_features, blocks)
    else:
        codes = weight.float()
        zero = torch.full((out_features, blocks), 128.0)
    dequantized = (codes - zero[..., None]) * scales.reshape(out_features, blocks, 1)
    if group_offsets is not None:
        dequantized = dequantized + group_offsets.t()[..., None]
    dequantized = dequantized.reshape(out_features, in_features)
    return torch.nn.functional.linear(input, dequantized.to(input.dtype), None if bias is None else bias.to(input.dtype))


@weight_only_linear.register_fake
def _(input, weight, scales, zero_points, group_offsets, bias, in_features, out_features, bits, block_size, accuracy_level,
      int8_prompts):
    return input.new_empty((*input.shape[:-1], out_features))


def _translation(int8_layers: list[tuple[str, WeightOnlyLinear]]):
    """The exporter's translation of ``aot::weight_only_linear``; ``int8_layers``: ``(path, layer)`` of the layers whose
    prompts run the int8 GEMM (:mod:`aot.export.onnx_prompt_gemm`), as the op's ``int8_prompts`` indexes them."""

    def onnx_weight_only_linear(input, weight, scales, zero_points=None, group_offsets=None, bias=None, in_features=0,
                                out_features=0, bits=4, block_size=32, accuracy_level=0, int8_prompts=-1):
        from onnxscript import opset18 as op
        from onnxscript.values import Op, Opset

        inputs = (input, weight, scales) if zero_points is None else (input, weight, scales, zero_points)
        attributes = dict(K=in_features, N=out_features, bits=bits, block_size=block_size, accuracy_level=accuracy_level)
        if int8_prompts < 0:
            output = Op(Opset(_CONTRIB, 1), "MatMulNBits", _matmul_nbits_schema())(*inputs, **attributes)
            if group_offsets is not None:  # Σ_g (Σ_{k in g} x_k) o_gn: the module doc's float zero points
                groups = op.Concat(op.Shape(input, end=-1), op.Constant(value_ints=[in_features // block_size, block_size]), axis=0)
                sums = op.ReduceSum(op.Reshape(input, groups), op.Constant(value_ints=[-1]), keepdims=0)
                output = op.Add(output, op.MatMul(sums, group_offsets))
            return output if bias is None else op.Add(output, bias)
        name, layer = int8_layers[int8_prompts]
        weight8, scale8 = int8_prompt_tensors(layer, name)
        for value in (weight8, scale8):
            weight.graph.register_initializer(value)
        step = ir.node("MatMulNBits", list(inputs), attributes=attributes, domain=_CONTRIB)
        prompt, decode = prompt_and_step_branches(input, step, bias, weight8, scale8, name)
        return op.If(is_prompt(input), then_branch=prompt, else_branch=decode)

    conditions: dict[tuple[str, ...], object] = {}  # {leading dims: their row count's condition}

    def is_prompt(input):
        """Whether ``input`` has more rows than ``PROMPT_ROWS``: computed once for all inputs whose leading dims are the
        same named dims (in a decoder, every layer's input), so that a decode step runs three nodes for it, not three
        for each layer. Inputs with an unnamed dim get their own."""
        from onnxscript import opset18 as op

        leading = None if input.shape is None else tuple(str(dim) for dim in input.shape[:-1])
        shared = leading is not None and "None" not in leading
        if shared and leading in conditions:
            return conditions[leading]
        condition = op.Greater(op.ReduceProd(op.Shape(input, end=-1), keepdims=0), op.Constant(value_int=PROMPT_ROWS))
        if shared:
            conditions[leading] = condition
        return condition

    return onnx_weight_only_linear


@functools.cache
def _matmul_nbits_schema():
    """ONNX Runtime's ``com.microsoft::MatMulNBits`` as an ``onnx.defs.OpSchema``: the onnx package registers no
    contrib ops, and the exporter records an op only with its schema. The inputs and attributes aot uses."""
    from onnx.defs import OpSchema

    parameter = OpSchema.FormalParameter
    optional = OpSchema.FormalParameterOption.Optional
    integer = OpSchema.AttrType.INT
    return OpSchema(
        "MatMulNBits", "com.microsoft", 1,
        inputs=[parameter("A", "T1"), parameter("B", "T2"), parameter("scales", "T1"),
                parameter("zero_points", "T3", param_option=optional)],
        outputs=[parameter("Y", "T1")],
        type_constraints=[("T1", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                          ("T2", ["tensor(uint8)"], ""), ("T3", ["tensor(uint8)", "tensor(float)"], "")],
        attributes=[OpSchema.Attribute(name, integer, "", required=True) for name in ("K", "N", "bits", "block_size")]
        + [OpSchema.Attribute("accuracy_level", integer, "", required=False)],
    )


def onnx_tensors(layer: WeightOnlyLinear) -> tuple[int, dict[str, torch.Tensor]]:
    """``(block_size, {name: tensor})``: the layer's codes as ``MatMulNBits`` takes them; see the module doc."""
    out_features, in_features = layer.out_features, layer.in_features
    if layer.bits == 4:
        block = layer.group_size
        tensors = {"weight": layer.weight.reshape(out_features, in_features // block, block // 2),
                   "weight_scale": layer.weight_scale.reshape(-1)}
        zero = getattr(layer, "weight_zero", None)
        if zero is not None and layer.zero_point == "float":  # the default zero point 8, and each group's offset
            tensors["weight_offset"] = layer.group_offsets().t().contiguous()
        elif zero is not None:  # two a byte, each row padded to whole bytes
            tensors["weight_zero"] = wo_pack_int4(torch.nn.functional.pad(zero, (0, zero.shape[1] % 2), value=0)).reshape(-1)
    else:
        block = next((size for size in _INT8_BLOCKS if in_features % size == 0), None)
        if block is None:
            raise ValueError(f"{in_features} input features: MatMulNBits needs a block of 16 or more that divides them")
        # the int8 codes as they are (a view): the exporter's translation stores them shifted, each as it is written
        tensors = {"weight": layer.weight.reshape(out_features, in_features // block, block),
                   "weight_scale": layer.weight_scale[:, None].expand(-1, in_features // block).reshape(-1).contiguous()}
    if layer.bias is not None:
        tensors["bias"] = layer.bias
    return block, tensors


def lower_weight_only_linears(gm: torch.fx.GraphModule, int8_prompts: bool = False) -> tuple[torch.fx.GraphModule, dict]:
    """``gm`` with each WeightOnlyLinear call as ``aot::weight_only_linear`` on MatMulNBits-shaped tensors, and the
    exporter's translation table for it.

    ``int8_prompts``: int4 layers with int8 activations run calls of more than a decode step's rows through ONNX
    Runtime's int8 GEMM (:mod:`aot.export.onnx_prompt_gemm`).

    The graph is copied and the lowered layers' tensors live on the copy's own holder modules, at
    the layers' paths (so the ONNX initializers keep the GraphModule's names); ``gm`` and its
    modules are left as they are. A graph without such layers comes back unchanged.
    """
    if not weight_only_calls(gm):
        return gm, {}
    graph = copied_graph(gm.graph)
    lowered_layers: dict[str, tuple[int, dict[str, torch.Tensor]]] = {}
    int8_layers: dict[str, int] = {}  # {path: index}
    for node in [node for node in graph.nodes if node.op == "call_module"]:
        layer = gm.get_submodule(str(node.target))
        if not isinstance(layer, WeightOnlyLinear):
            continue
        if str(node.target) not in lowered_layers:  # a layer called at several sites: its tensors made once
            lowered_layers[str(node.target)] = onnx_tensors(layer)
            if (int8_prompts and layer.bits == 4 and layer.activations == "int8" and layer.zero_point == "integer"
                    and _sees_prompts(graph, str(node.target))):  # float zero points: their offsets on every call
                int8_layers[str(node.target)] = len(int8_layers)
        block, tensors = lowered_layers[str(node.target)]
        with graph.inserting_before(node):
            # create_node, not get_attr: get_attr warns when gm's layer lacks the name (weight_offset), which the
            # copy's holder modules below have
            got = {name: graph.create_node("get_attr", f"{node.target}.{name}") for name in tensors}
            call = graph.call_function(torch.ops.aot.weight_only_linear.default, (
                node.args[0] if node.args else node.kwargs["input"], got["weight"], got["weight_scale"],
                got.get("weight_zero"), got.get("weight_offset"), got.get("bias"), layer.in_features, layer.out_features, layer.bits, block,
                _ACCURACY_LEVELS[layer.activations], int8_layers.get(str(node.target), -1),
            ))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
    root = {**{target: operator.attrgetter(target)(gm) for target in _targets(graph) if not _under(target, lowered_layers)},
            **{f"{target}.{name}": tensor for target, (_, tensors) in lowered_layers.items() for name, tensor in tensors.items()}}
    lowered = torch.fx.GraphModule(root, graph, class_name=type(gm).__name__)
    lowered.meta.update(gm.meta)
    indexed = [(target, gm.get_submodule(target)) for target in int8_layers]
    return lowered, {torch.ops.aot.weight_only_linear.default: _translation(indexed)}


def weight_only_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The calls of a ``WeightOnlyLinear`` in ``gm``: what :func:`lower_weight_only_linears` replaces."""
    return [node for node in gm.graph.nodes
            if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), WeightOnlyLinear)]


def shift_int8_codes_on_write(model: ir.Model) -> int:
    """Have each int8 layer's codes ``q`` (int8, as the exporter took them from the lowered graph) stored as
    ``MatMulNBits`` reads them, ``q + 128`` in uint8, each made as the file is written (an ``onnx_ir.LazyTensor``).

    The exporter assigns every initializer the graph's own tensor once its nodes are translated, so the
    shift cannot be made earlier, and made at once it would hold a second copy of every int8 layer beside
    the graph's codes (1.2 GB for a 1B model). A weight several nodes read is shifted once. Returns how
    many were."""
    shifted = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type != "MatMulNBits" or node.domain != _CONTRIB or node.attributes.get_int("bits", 4) != 8:
            continue
        weight = node.inputs[1]
        codes = weight.const_value
        if codes is None or codes.dtype != ir.DataType.INT8:
            continue
        weight.const_value = ir.LazyTensor(functools.partial(_shifted_by_128, codes, weight.name), dtype=ir.DataType.UINT8,
                                           shape=codes.shape, name=weight.name)
        weight.dtype = ir.DataType.UINT8
        shifted += 1
    return shifted


def declare_contrib_domain(model: ir.Model) -> int:
    """Declare ``com.microsoft`` (version 1) among the model's opset imports where a node uses it and the exporter did
    not: it declares the domains of the nodes it recorded, not of those in the If branches that ``int8_prompts``
    builds itself (:mod:`aot.export.onnx_prompt_gemm`), which may then hold every ``MatMulNBits``. Returns 1 when it
    declared the domain, 0 when it was declared or unused."""
    if _CONTRIB in model.opset_imports:
        return 0
    if not any(node.domain == _CONTRIB for node in ir.traversal.RecursiveGraphIterator(model.graph)):
        return 0
    model.opset_imports[_CONTRIB] = 1
    return 1


def _shifted_by_128(codes: ir.TensorProtocol, name: str) -> ir.Tensor:
    # q + 128 as a byte is q's two's-complement byte with its top bit flipped: one uint8 array made, where widening to
    # int16 and adding made two int16 ones first (the 1B's lm_head: 2 x 501 MiB at once, in the export child)
    return ir.tensor(np.bitwise_xor(codes.numpy().view(np.uint8), np.uint8(0x80)), name=name)


def _sees_prompts(graph: torch.fx.Graph, target: str) -> bool:
    """Whether a call of the layer ``target`` may multiply several positions of a sequence: not when each call site's
    input has one position (a ``logits: last`` decoder's lm_head, fed the last hidden state), whose rows are a batch's
    one token each and MatMulNBits' to run, however many; then no int8 copy of its weights is stored."""
    for node in graph.nodes:
        if node.op == "call_module" and str(node.target) == target:
            value = (node.args[0] if node.args else node.kwargs["input"]).meta.get("val")
            if value is None or value.dim() < 2 or not isinstance(value.shape[-2], int) or value.shape[-2] != 1:
                return True
    return False


def _targets(graph: torch.fx.Graph) -> list[str]:
    return list(dict.fromkeys(str(node.target) for node in graph.nodes if node.op in ("get_attr", "call_module")))


def _under(target: str, holders: dict) -> bool:
    return any(target == path or target.startswith(path + ".") for path in holders)


def _unpacked_zero_points(packed: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """``MatMulNBits``'s 4-bit zero points (two a byte, rows padded to whole bytes) as floats ``(rows, blocks)``."""
    return wo_unpack_int4(packed.reshape(rows, -1))[:, :blocks].float()
