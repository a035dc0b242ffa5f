"""The ONNX artifact: dynamo export, named dynamic axes, checker, ONNX Runtime against eager."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.fx

from aot.errors import ExportError
from aot.export import export_onnx, onnx_export, optimize_onnx, run_onnx
from aot.outputs import flatten_outputs

from . import models

CONVNET_DIMS = {"x": {0: "batch", 2: "height", 3: "width"}}


def _cases():
    """(key, eager model, graph builder, dynamic dims, inputs at three shapes)."""
    bert, resnet, convnet = models.tiny_bert(), models.tiny_resnet(), models.convnet()
    text = [models.text_inputs(b, s) for b, s in models.TEXT_SHAPES]
    images = [models.image_inputs(b, s) for b, s in models.IMAGE_SHAPES]
    image_dims = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}
    return {
        "bert_fx": (bert, lambda: models.fx_graph(bert, ["input_ids", "attention_mask"]), models.TEXT_DIMS, text),
        "bert_export": (bert, lambda: models.export_graph(bert, text[0], models.TEXT_DIMS), models.TEXT_DIMS, text),
        "resnet_export": (resnet, lambda: models.export_graph(resnet, images[0], image_dims, min_size=16), image_dims, images),
        "convnet_fx": (
            convnet,
            lambda: torch.fx.symbolic_trace(convnet),
            CONVNET_DIMS,
            [models.convnet_inputs(b, s) for b, s in models.CONVNET_SHAPES],
        ),
    }


CASES = _cases()


def _dims(value_info) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CASES))
def test_onnx_matches_eager_with_named_dynamic_axes(tmp_path, key):
    model, build, dims, inputs = CASES[key]
    gm = build()
    path = tmp_path / "model.onnx"
    assert export_onnx(gm, path, inputs[0], dims) == [path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]

    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    graph_inputs = {value.name: _dims(value) for value in proto.graph.input}
    for name, axes in dims.items():
        for axis, dim_name in axes.items():
            assert graph_inputs[name][axis] == dim_name, f"{name} axis {axis}: {graph_inputs[name]}"
    with torch.no_grad():
        expected_names = list(flatten_outputs(model(**inputs[0])))
    assert [value.name for value in proto.graph.output] == expected_names

    _assert_matches_eager(model, path, inputs, key)
    if key == "bert_export":  # the recipe's `optimize: transformer` stage, on the same file
        optimize_onnx(path, "transformer", None)
        assert _op_types(path)["SkipLayerNormalization"] > 0
        _assert_matches_eager(model, path, inputs, f"{key} optimised")
    if key == "bert_fx":  # the recipe's `optimize: ort_fusions` stage, for both targets
        assert "MultiHeadAttention" not in _op_types(path)
        cuda_path = tmp_path / "cuda" / "model.onnx"
        cuda_path.parent.mkdir()
        cuda_path.write_bytes(path.read_bytes())
        optimize_onnx(path, "ort_fusions", None)
        fused = _op_types(path)
        assert fused.get("MultiHeadAttention", 0) > 0 and "SkipLayerNormalization" not in fused, fused
        onnx.checker.check_model(str(path), full_check=True)
        _assert_matches_eager(model, path, inputs, f"{key} fused")
        optimize_onnx(cuda_path, "ort_fusions", None, target="cuda")
        fused_for_cuda = _op_types(cuda_path)
        assert fused_for_cuda.get("SkipLayerNormalization", 0) > 0, fused_for_cuda
        _assert_matches_eager(model, cuda_path, inputs, f"{key} fused for cuda, run on CPU")


def _op_types(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(path).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _assert_matches_eager(model, path, inputs, label) -> None:
    assert len({tuple(t.shape) for case in inputs for t in case.values()}) >= 3
    for case in inputs:
        with torch.no_grad():
            want = flatten_outputs(model(**case))
        got = run_onnx(path, case)
        assert list(got) == list(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-4, rtol=1e-4, err_msg=f"{label} {name}")


@torch.library.custom_op("aot_onnx_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


class Rejected(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.aot_onnx_test.mystery(self.linear(x))


def test_rejected_graph_raises_one_line_and_leaves_nothing(tmp_path):
    gm = torch.fx.symbolic_trace(Rejected())
    path = tmp_path / "out" / "model.onnx"
    path.parent.mkdir()
    with pytest.raises(ExportError) as raised:
        export_onnx(gm, path, {"x": torch.randn(2, 4)}, {"x": {0: "batch"}})
    message = str(raised.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith("torch.onnx.export rejects the graph for model.onnx:")
    assert "aot_onnx_test.mystery" in message
    assert list(path.parent.iterdir()) == []


def test_opset_is_configurable(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    path = tmp_path / "model.onnx"
    export_onnx(gm, path, models.convnet_inputs(2, 8), None, opset=20)
    proto = onnx.load(path)
    assert {o.domain: o.version for o in proto.opset_import}[""] == 20
    assert all(isinstance(d, int) for value in proto.graph.input for d in _dims(value)), "no dynamic dims asked"


def test_opset_the_converter_cannot_reach_is_an_error(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    with pytest.raises(ExportError, match="opset 17 was asked for but the exporter produced opset 18"):
        export_onnx(gm, tmp_path / "model.onnx", models.convnet_inputs(2, 8), None, opset=17)
    assert list(tmp_path.iterdir()) == []


def test_large_weights_go_to_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    model = models.convnet()
    gm = torch.fx.symbolic_trace(model)
    path = tmp_path / "model.onnx"
    written = export_onnx(gm, path, models.convnet_inputs(2, 8), CONVNET_DIMS)
    assert written == [path, tmp_path / "model.onnx.data"]
    proto = onnx.load(path, load_external_data=False)
    conv_weight = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    assert conv_weight.data_location == onnx.TensorProto.EXTERNAL  # tiny tensors may stay inline
    onnx.checker.check_model(str(path), full_check=True)
    case = models.convnet_inputs(3, 6)
    with torch.no_grad():
        want = flatten_outputs(model(**case))
    got = run_onnx(path, case)
    np.testing.assert_allclose(got["logits"], want["logits"].numpy(), atol=1e-4, rtol=1e-4)


def test_unknown_dynamic_input_is_refused(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    with pytest.raises(ExportError, match="dynamic dims name input\\(s\\) pixels that the graph does not take"):
        export_onnx(gm, tmp_path / "model.onnx", models.convnet_inputs(2, 8), {"pixels": {0: "batch"}})
    assert list(tmp_path.iterdir()) == []


def test_run_onnx_names_a_missing_input(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    path = tmp_path / "model.onnx"
    export_onnx(gm, path, models.convnet_inputs(2, 8), CONVNET_DIMS)
    with pytest.raises(ExportError, match="input 'x' is missing"):
        run_onnx(path, {"y": np.zeros((1, 3, 8, 8), dtype=np.float32)})


class PositionTable(torch.nn.Module):
    """Adds a learned table of 8 positions, for sequences of at most 8."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


def test_bounded_dims_keep_their_names_and_hold_over_their_range(tmp_path):
    gm = torch.fx.symbolic_trace(PositionTable())
    path = tmp_path / "model.onnx"
    dims = {"x": {0: "batch", 1: "sequence"}}
    export_onnx(gm, path, {"x": torch.randn(2, 5, 4)}, dims, dim_ranges={"batch": (1, 16), "sequence": (2, 8)})
    assert _dims(onnx.load(path).graph.input[0]) == ["batch", "sequence", 4]
    for batch, sequence in ((1, 2), (3, 8)):
        x = torch.randn(batch, sequence, 4)
        with torch.no_grad():
            want = gm(x).numpy()
        np.testing.assert_allclose(run_onnx(path, {"x": x})["output"], want, atol=1e-6)


def test_strided_initializers_are_written_row_major(tmp_path):
    import onnx_ir as ir

    columns = np.arange(24, dtype=np.float32).reshape(4, 6).T  # a transposed view, as the exporter's MatMul weights
    assert not columns.flags.c_contiguous
    value = ir.Value(name="w", shape=ir.Shape(columns.shape), type=ir.TensorType(ir.DataType.FLOAT))
    value.const_value = ir.Tensor(columns, name="w")
    graph = ir.Graph([], [value], nodes=[], initializers=[value], opset_imports={"": 18}, name="g")
    model = ir.Model(graph, ir_version=10)
    onnx_export._contiguous_on_write(model)
    path = tmp_path / "strided.onnx"
    ir.save(model, str(path), external_data="strided.onnx.data")
    written = onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0], base_dir=str(tmp_path))
    np.testing.assert_array_equal(written, columns)
