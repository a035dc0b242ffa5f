"""split_feed_forward: each MatMul -> BiasGelu -> MatMul block becomes two half-width blocks, same outputs."""

from __future__ import annotations

import pytest
import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxruntime
import torch
import transformers
from onnx import TensorProto, helper

from aot.export import run_onnx
from aot.export.onnx_rules import ONNX_RULES, miss_reasons
from aot.tracing.outputs import flatten_outputs

from . import models
from .as_built import write_as_built

HIDDEN = 8
SHAPES = [(1, 3), (2, 7), (4, 16)]  # (batch, sequence)


def _feed_forward(width: int, block_output_is_graph_output: bool = False) -> ir.Model:
    """``y = MatMul(BiasGelu(MatMul(x, W1), b1), W2) + x``: one block of hidden width ``width``, a residual after it."""
    rng = np.random.default_rng(width)

    def weight(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="up"),
        helper.make_node("BiasGelu", ["h", "b1"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("MatMul", ["g", "W2"], ["y"], name="down"),
        helper.make_node("Add", ["y", "x"], ["out"], name="residual"),
    ]
    shape = ["batch", "sequence", HIDDEN]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)]
    if block_output_is_graph_output:
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, shape))
    graph = helper.make_graph(
        nodes,
        "feed_forward",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        outputs,
        initializer=[weight("W1", HIDDEN, width), weight("b1", width), weight("W2", width, HIDDEN)],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=opsets, ir_version=10))


def _split(model: ir.Model) -> int:
    """The rule alone, then the unused-node sweep that :func:`fuse_for_ort` runs after the rules."""
    count = ONNX_RULES["split_feed_forward"].rewrite_rule().apply_to_model(model)
    common_passes.RemoveUnusedNodesPass()(model)
    return count


def _op_types(model: ir.Model) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph)


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model).SerializeToString()
    return onnxruntime.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_the_block_becomes_two_half_width_blocks_with_the_same_outputs():
    original, model = _feed_forward(16), _feed_forward(16)
    assert _op_types(model) == {"MatMul": 2, "BiasGelu": 1, "Add": 1}  # the precondition: one block

    assert _split(model) == 1  # the halves, 8 wide, are blocks too, but not split again
    assert _op_types(model) == {"MatMul": 4, "BiasGelu": 2, "Add": 2}
    assert [node.name for node in model.graph] == [
        *(f"feed_forward_0_part_{part}_{step}" for part in (0, 1) for step in ("up", "gelu", "down")),
        "feed_forward_0_sum",
        "residual",
    ]
    assert all(not node.metadata_props for node in model.graph)
    assert sorted(model.graph.initializers) == sorted(
        f"feed_forward_0_part_{part}.{weight}" for part in (0, 1) for weight in ("up.weight", "up.bias", "down.weight")
    )
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)

    rng = np.random.default_rng(0)
    for batch, sequence in SHAPES:
        x = rng.standard_normal((batch, sequence, HIDDEN)).astype(np.float32)
        (want,), (got,) = _run(original, x), _run(model, x)
        # the same sums, added in another order: a few ulp apart
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}, sequence {sequence}")


def test_a_block_of_odd_width_is_left_whole_and_the_rule_says_why():
    model = _feed_forward(15)
    assert miss_reasons(model, "split_feed_forward") == ["the hidden width 15 is odd: there are no two equal halves"]
    assert _split(model) == 0
    assert _op_types(model) == {"MatMul": 2, "BiasGelu": 1, "Add": 1}


def test_a_block_whose_output_is_a_graph_output_is_left_whole_and_the_rule_says_why():
    model = _feed_forward(16, block_output_is_graph_output=True)
    assert miss_reasons(model, "split_feed_forward") == ["the block's output y is a graph output"]
    assert _split(model) == 0


def test_a_block_with_weights_that_are_no_constants_is_left_whole_and_the_rule_says_why():
    model = _feed_forward(16)
    w2 = model.graph.initializers.pop("W2")
    w2.const_value = None  # fed at run time instead
    model.graph.inputs.append(w2)
    assert miss_reasons(model, "split_feed_forward") == ["the down-projection weight W2 is not a constant"]
    assert _split(model) == 0


def _bert(intermediate_size: int) -> transformers.BertModel:
    config = transformers.BertConfig(
        vocab_size=models.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=intermediate_size, max_position_embeddings=64, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def _ops(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def _export(model, path, target):
    gm = models.fx_graph(model, ["input_ids", "attention_mask"])
    # float32 on either target, so that both run and compare on CPU
    return write_as_built(gm, models.text_inputs(2, 7), models.TEXT_DIMS, path, optimize="ort_fusions", target=target, precision="float32")


@pytest.mark.artifact
def test_cpu_target_splits_every_block_and_keeps_the_outputs(tmp_path):
    model = _bert(intermediate_size=64)
    unsplit = _export(model, tmp_path / "cuda" / "model.onnx", "cuda")
    assert unsplit["bias_gelu"] == 2 and "split_feed_forward" not in unsplit
    assert _ops(tmp_path / "cuda" / "model.onnx")["BiasGelu"] == 2  # the precondition: one block per layer

    split = _export(model, tmp_path / "cpu" / "model.onnx", "cpu")
    assert split["split_feed_forward"] == 2
    ops = _ops(tmp_path / "cpu" / "model.onnx")
    assert ops["BiasGelu"] == 4
    assert ops["MatMul"] == _ops(tmp_path / "cuda" / "model.onnx")["MatMul"] + 2 * 2  # two more per block
    assert len({tuple(t.shape) for b, s in models.TEXT_SHAPES for t in models.text_inputs(b, s).values()}) >= 3
    for batch, sequence in models.TEXT_SHAPES:
        inputs = models.text_inputs(batch, sequence)
        with torch.no_grad():
            want = flatten_outputs(model(**inputs))
        got = run_onnx(tmp_path / "cpu" / "model.onnx", inputs)
        for name in want:
            np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-5, rtol=1e-4, err_msg=name)


@pytest.mark.artifact
def test_a_bert_of_odd_width_is_exported_with_its_blocks_whole(tmp_path):
    fusions = _export(_bert(intermediate_size=37), tmp_path / "model.onnx", "cpu")
    assert fusions["bias_gelu"] == 2  # the blocks are there, fused ...
    assert fusions["split_feed_forward"] == 0  # ... but have no two equal halves
    assert _ops(tmp_path / "model.onnx")["BiasGelu"] == 2
