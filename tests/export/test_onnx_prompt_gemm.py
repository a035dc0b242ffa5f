"""`export.onnx.int4_prompts: int8_gemm`: int4 layers branch between MatMulNBits (decode steps) and the int8 GEMM (prompts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from pydantic import ValidationError

from aot.export.onnx_prompt_gemm import PROMPT_ROWS
from aot.passes import QuantizeLinearWeights
from aot.recipe.schema import OnnxSpec
from aot.runtime import WeightOnlyLinear, weight_only_linear
from tests.ort_int8 import DEPTH, EXACT, SATURATED, ort_u8s8_sums_exact, saturating_product, skip_unless_ort_u8s8_sums_exact
from tests.passes.helpers import fx_graph

from .as_built import write_as_built


class ThreeLayers(torch.nn.Module):
    """An int4 layer with a bias, one without, and one computing in float (no int8 prompts for it)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64, bias=False)
        self.out = torch.nn.Linear(64, 32)

    def forward(self, input):
        return self.out(self.down(torch.nn.functional.silu(self.up(input))))


def _quantized(symmetric: bool) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model = ThreeLayers().eval()
    with torch.no_grad():
        model.up.weight.add_(0.05)  # off-centre: asymmetric zero points differ from 8
    graph_module = fx_graph(model, torch.randn(2, 3, 64))
    QuantizeLinearWeights(bits=4, group_size=32, symmetric=symmetric, skip=["out"])(graph_module)
    QuantizeLinearWeights(bits=4, group_size=32, symmetric=symmetric, activations="float")(graph_module)
    return graph_module


def _layers(graph_module) -> dict[str, WeightOnlyLinear]:
    return {name: module for name, module in graph_module.named_modules() if isinstance(module, WeightOnlyLinear)}


def _export(graph_module, path: Path, **options) -> onnx.ModelProto:
    write_as_built(graph_module, {"input": torch.randn(2, 3, 64)}, {"input": {0: "batch", 1: "sequence"}}, path, **options)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module", params=[True, False], ids=["symmetric", "asymmetric"])
def exported(request, tmp_path_factory):
    graph_module = _quantized(request.param)
    layers = _layers(graph_module)
    assert [layer.activations for layer in layers.values()] == ["int8", "int8", "float"], "precondition: two int8-activation layers"
    path = tmp_path_factory.mktemp("prompts") / "model.onnx"
    return graph_module, _export(graph_module, path, int4_prompts="int8_gemm"), path


@pytest.mark.artifact
def test_each_int8_activation_layer_branches_between_matmul_nbits_and_the_int8_gemm(exported):
    graph_module, model, _ = exported
    branches = [node for node in model.graph.node if node.op_type == "If"]
    assert len(branches) == 2, "up and down; out computes in float and keeps one MatMulNBits"
    assert [node.op_type for node in model.graph.node].count("MatMulNBits") == 1
    for node in branches:
        graphs = {attribute.name: attribute.g for attribute in node.attribute}
        prompt = [n.op_type for n in graphs["then_branch"].node]
        step = [n.op_type for n in graphs["else_branch"].node]
        assert "MatMulInteger" in prompt and "MatMulNBits" not in prompt
        assert {"TopK", "Unique", "MatMul"} <= set(prompt), "each row's largest activations multiplied in float"
        assert step[0] == "MatMulNBits" and "MatMulInteger" not in step
    assert {opset.domain for opset in model.opset_import} >= {"", "com.microsoft"}
    assert [node.op_type for node in model.graph.node].count("ReduceProd") == 1, "one row count for both layers' inputs"


def test_the_int8_weights_stored_are_the_graph_modules_prompt_weights(exported):
    graph_module, model, _ = exported
    initializers = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    for name, layer in _layers(graph_module).items():
        if layer.activations == "float":
            assert f"{name}.weight_int8" not in initializers
            continue
        codes, scale = layer.int8_regrid()
        assert initializers[f"{name}.weight_int8"].dtype == np.int8
        np.testing.assert_array_equal(initializers[f"{name}.weight_int8"], codes.t().numpy())
        np.testing.assert_array_equal(initializers[f"{name}.weight_int8_scale"], scale.numpy())


@pytest.mark.parametrize("shape", [(1, 1), (2, 4), (1, 9), (3, 7)], ids=lambda shape: f"{shape[0]}x{shape[1]}")
def test_onnx_runtime_computes_what_the_graph_module_computes_on_either_side_of_the_branch(exported, shape):
    """More than 8 rows: both artifacts run the int8 GEMM on the same int8 weights and rows, so they agree to float32
    rounding; at most 8: MatMulNBits against torch's int4 kernel, which round the activations differently (int8 per
    block against bfloat16), so they agree to the int4 layers' activation rounding only."""
    graph_module, _, path = exported
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    torch.manual_seed(1)
    x = torch.randn(*shape, 64)
    with torch.no_grad():
        want = graph_module(x).numpy()
    got = session.run(None, {"input": x.numpy()})[0]
    rows = shape[0] * shape[1]
    scale = np.abs(want).max()
    assert scale > 0.1, "precondition: outputs far from zero"
    if rows > PROMPT_ROWS:
        skip_unless_ort_u8s8_sums_exact()
        # the layers' inputs differ in their last bits (ONNX Runtime's SiLU is not torch's), which can move a value
        # lying half-way between two int8 levels to the other level: one level of one row, not a different formula
        error = np.abs(got - want)
        assert np.median(error) <= 1e-6 * scale, f"median difference {np.median(error) / scale:.1e} of the output's scale"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3 * scale)
    else:
        error = np.abs(got - want).max() / scale
        assert 1e-5 < error < 0.02, f"MatMulNBits and torch's int4 kernel differ by {error:.2e} of the output's scale"


class MatMulNBits(OpRun):
    """com.microsoft's MatMulNBits as its contrib-op spec defines it, for ``onnx.reference`` (which has no such op; it
    finds an op by its class's name):
    ``a @ ((q - z) · s)^T``, q two 4-bit codes a byte (the even column low), z 8 or the stored zero points."""

    op_domain = "com.microsoft"

    def _run(self, a, b, scales, zero_points=None, *unused, K=None, N=None, bits=4, block_size=32, accuracy_level=0):
        groups = K // block_size
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(N, groups, block_size).astype(np.float32)
        if zero_points is None:
            zero = np.full((N, groups), 8, np.float32)
        elif zero_points.dtype == np.uint8:
            zero = np.stack([zero_points & 15, zero_points >> 4], axis=-1).reshape(N, -1)[:, :groups].astype(np.float32)
        else:
            zero = zero_points.reshape(N, groups)
        weight = ((codes - zero[..., None]) * scales.reshape(N, groups)[..., None]).reshape(N, K)
        return (a @ weight.T,)


class GatherElements(OpRun):
    """``np.take_along_axis``: onnx.reference's own GatherElements fails on (M, k) indices into (M, K) data (onnx 1.2x:
    "cannot reshape array of size 9 into shape (9,8)")."""

    op_domain = ""

    def _run(self, data, indices, axis=0):
        return (np.take_along_axis(data, indices, axis=axis),)


@pytest.mark.parametrize("shape", [(1, 9), (3, 7), (2, 40)], ids=lambda shape: f"{shape[0]}x{shape[1]}")
def test_the_prompt_branch_computes_the_graph_modules_int8_sums_on_any_cpu(exported, shape, monkeypatch):
    """ONNX's own reference evaluator (exact integer MatMulInteger, no uint8 saturation) runs the prompt branch where
    ONNX Runtime cannot be trusted to (CPUs without VNNI): the same int8 sums as the GraphModule, so the same output
    to float32 rounding, with each row's outliers far off the rest."""
    # the GraphModule's int8 GEMMs from the 9th row, as on a CPU with int8 dot products (one without them runs torch's
    # int4 kernel up to _WO_BF16_KERNEL_ROWS rows; the same sums otherwise: _wo_int8_sums)
    monkeypatch.setattr(weight_only_linear, "_wo_vnni", lambda: True)
    graph_module, model, _ = exported
    evaluator = ReferenceEvaluator(model, new_ops=[MatMulNBits, GatherElements])
    torch.manual_seed(1)
    x = torch.randn(*shape, 64)
    x[..., [5, 40]] *= 30  # two outlier channels in every row
    assert shape[0] * shape[1] > PROMPT_ROWS, "precondition: the prompt branch"
    with torch.no_grad():
        want = graph_module(x).numpy()
    (got,) = evaluator.run(None, {"input": x.numpy()})
    scale = np.abs(want).max()
    assert scale > 0.1, "precondition: outputs far from zero"
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale)


@pytest.mark.artifact
def test_without_the_option_no_layer_branches_and_no_int8_weights_are_stored(tmp_path):
    graph_module = _quantized(True)
    model = _export(graph_module, tmp_path / "model.onnx")
    assert [node.op_type for node in model.graph.node].count("MatMulNBits") == 3
    assert not any(node.op_type == "If" for node in model.graph.node)
    assert not any(tensor.name.endswith("_int8") for tensor in model.graph.initializer)


def test_int8_prompts_need_opset_18():
    assert OnnxSpec(int4_prompts="int8_gemm").opset >= 18, "precondition: the default opset takes them"
    with pytest.raises(ValidationError, match="int4_prompts: int8_gemm` needs opset 18"):
        OnnxSpec(int4_prompts="int8_gemm", opset=17)


class LastPositionHead(torch.nn.Module):
    """A `logits: last` decoder's shape: the head sees one position of each sequence."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(64, 64)
        self.lm_head = torch.nn.Linear(64, 32, bias=False)

    def forward(self, input):
        return self.lm_head(self.body(input)[:, -1:])


@pytest.mark.artifact
def test_a_layer_that_sees_one_position_a_sequence_stores_no_int8_weights(tmp_path):
    torch.manual_seed(0)
    graph_module = fx_graph(LastPositionHead().eval(), torch.randn(2, 3, 64))
    QuantizeLinearWeights(bits=4, group_size=32)(graph_module)
    assert set(_layers(graph_module)) == {"body", "lm_head"}, "precondition: both layers int4"
    model = _export(graph_module, tmp_path / "model.onnx", int4_prompts="int8_gemm")
    assert [node.op_type for node in model.graph.node if node.op_type in ("If", "MatMulNBits")] == ["If", "MatMulNBits"]
    stored = {tensor.name for tensor in model.graph.initializer}
    assert "body.weight_int8" in stored and "lm_head.weight_int8" not in stored
    skip_unless_ort_u8s8_sums_exact()
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(1, 12, 64)
    with torch.no_grad():
        want = graph_module(x).numpy()
    np.testing.assert_allclose(session.run(None, {"input": x.numpy()})[0], want, rtol=0.02, atol=0.02 * np.abs(want).max())


def test_onnx_runtime_s_uint8_gemm_is_exact_or_saturates_its_pairs():
    """What the skips above rest on: either every sum is exact (VNNI), or each neighbouring pair of products was clamped
    to an int16, and the torch side (torch._int_mm, int8 x int8) is exact all the same."""
    got = saturating_product()
    assert (got == (EXACT if ort_u8s8_sums_exact() else SATURATED)).all(), got
    codes = torch.full((2, DEPTH), 127, dtype=torch.int8)
    assert (torch._int_mm(codes.repeat(8, 1), torch.full((DEPTH, 8), 127, dtype=torch.int8)) == 127 * 127 * DEPTH).all()
