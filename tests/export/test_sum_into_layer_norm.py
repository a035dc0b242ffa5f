"""sum_into_layer_norm: Add -> LayerNormalization becomes Sum -> LayerNormalization, and ORT leaves it unfused."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
from onnx import TensorProto, helper

from aot.export.onnx_rules import ONNX_RULES, miss_reasons

HIDDEN = 16
SHAPES = [(1, 3), (4, 9), (2, 17)]  # (batch, sequence)


def _residual_block() -> onnx.ModelProto:
    """y = LayerNormalization(x + residual); the residual's Add also feeds a second, plain output."""
    rng = np.random.default_rng(0)
    gamma = helper.make_tensor("gamma", TensorProto.FLOAT, [HIDDEN], rng.standard_normal(HIDDEN).astype(np.float32))
    beta = helper.make_tensor("beta", TensorProto.FLOAT, [HIDDEN], rng.standard_normal(HIDDEN).astype(np.float32))
    residual_add = helper.make_node("Add", ["x", "residual"], ["s"], name="residual_add")
    helper.set_metadata_props(residual_add, {"pkg.torch.onnx.fx_node": "%add_1", "namespace": "encoder.layer.0"})
    nodes = [
        residual_add,
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12, name="norm"),
        helper.make_node("Add", ["x", "x"], ["twice"], name="unrelated_add"),
    ]
    shape = ["batch", "sequence", HIDDEN]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "residual")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("y", "twice")],
        initializer=[gamma, beta],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _sum_into_layer_norm(model: ir.Model) -> int:
    return ONNX_RULES["sum_into_layer_norm"].rewrite_rule().apply_to_model(model)


def _ort_ops_after_load(path, tmp_path) -> tuple[onnxruntime.InferenceSession, collections.Counter]:
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"ort_{path.name}")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops = collections.Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)
    return session, ops


def test_norm_fed_by_sum_is_left_unfused_by_onnx_runtime_with_the_same_outputs(tmp_path):
    original = tmp_path / "add.onnx"
    onnx.save(_residual_block(), original)
    _, fused_at_load = _ort_ops_after_load(original, tmp_path)
    assert fused_at_load["SkipLayerNormalization"] == 1, fused_at_load  # the precondition: ORT fuses Add -> LN

    model = ir.load(str(original))
    assert _sum_into_layer_norm(model) == 1
    ops = collections.Counter(node.op_type for node in model.graph)
    assert ops["Sum"] == 1 and ops["Add"] == 1, ops  # the Add that feeds no norm stays
    # The Sum is the Add in its place: its name, output and torch metadata, and nothing more.
    total = model.graph.node(0)
    assert (total.op_type, total.name, total.outputs[0].name) == ("Sum", "residual_add", "s")
    assert dict(total.metadata_props) == {"pkg.torch.onnx.fx_node": "%add_1", "namespace": "encoder.layer.0"}
    rewritten = tmp_path / "sum.onnx"
    ir.save(model, str(rewritten))
    onnx.checker.check_model(str(rewritten), full_check=True)
    session, loaded_ops = _ort_ops_after_load(rewritten, tmp_path)
    assert loaded_ops["SkipLayerNormalization"] == 0 and loaded_ops["LayerNormalization"] == 1, loaded_ops

    reference = onnxruntime.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    for batch, sequence in SHAPES:
        feed = {name: np.random.default_rng(batch).standard_normal((batch, sequence, HIDDEN)).astype(np.float32) for name in ("x", "residual")}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_add_that_feeds_no_norm_is_left_alone_and_the_rule_says_why():
    proto = _residual_block()
    proto.graph.node[1].input[0] = "x"  # the norm now reads x directly
    model = ir.serde.deserialize_model(proto)
    assert sorted(miss_reasons(model, "sum_into_layer_norm")) == [
        "s is the input X of no LayerNormalization",
        "twice is the input X of no LayerNormalization",
    ]
    assert _sum_into_layer_norm(model) == 0
    assert [node.op_type for node in model.graph].count("Add") == 2


def test_an_add_that_feeds_a_norm_only_as_its_scale_is_left_alone():
    proto = _residual_block()
    proto.graph.node[1].input[:2] = ["x", "s"]  # the Add's output is the norm's scale, not its input X
    model = ir.serde.deserialize_model(proto)
    assert "s is the input X of no LayerNormalization" in miss_reasons(model, "sum_into_layer_norm")
    assert _sum_into_layer_norm(model) == 0


def test_before_opset_8_the_rule_says_why():
    proto = _residual_block()
    model = ir.serde.deserialize_model(proto)
    model.opset_imports[""] = 7
    assert "opset 7: Sum broadcasts like Add only from opset 8" in miss_reasons(model, "sum_into_layer_norm")
    assert _sum_into_layer_norm(model) == 0
