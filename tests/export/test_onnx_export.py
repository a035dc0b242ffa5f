"""The ONNX artifact as the build writes it: dynamo export, named dynamic axes, checker, ONNX Runtime against eager."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.fx

from aot.errors import ExportError
from aot.export import onnx_export, optimize_onnx, run_onnx
from aot.tracing.outputs import flatten_outputs

from . import models
from .as_built import write_as_built

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


@pytest.mark.artifact
@pytest.mark.parametrize("key", list(CASES))
def test_onnx_matches_eager_with_named_dynamic_axes(tmp_path, key):
    model, build, dims, inputs = CASES[key]
    path = tmp_path / "model.onnx"
    assert write_as_built(build(), inputs[0], dims, path) == {}  # the recipe's default: optimize: none
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # external_data: always

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
    assert not {"MultiHeadAttention", "SkipLayerNormalization", "BiasGelu"} & set(_op_types(path))  # nothing fused


@pytest.mark.full  # four optimised exports; the shipped recipes' tiny builds run ort_fusions for the cpu in the artifact tier
@pytest.mark.parametrize(
    "key, optimize, target, exporter_optimize",
    [
        ("bert_fx", "ort_fusions", "cpu", False),
        ("bert_fx", "ort_fusions", "cuda", False),
        # onnx.checker rejected this one: the optimizer transposes weights in place, their value_info stayed
        ("bert_export", "transformer", "cpu", False),
        ("bert_export", "transformer", "cpu", True),
    ],
)
def test_onnx_optimised_as_the_recipe_asks_matches_eager(tmp_path, key, optimize, target, exporter_optimize):
    model, build, dims, inputs = CASES[key]
    path = tmp_path / "model.onnx"
    # float32 on either target, so the fused model compares with eager at float32 tolerances on CPU
    fusions = write_as_built(
        build(), inputs[0], dims, path, optimize=optimize, target=target, exporter_optimize=exporter_optimize, precision="float32"
    )
    ops = _op_types(path)
    if optimize == "transformer":  # the file-level stage: its counts are logged, not returned
        assert fusions == {} and ops.get("BiasGelu", 0) > 0, ops
        # its skip-LayerNorm fusion recognises the residual adds only in the exporter's folded graph
        assert (ops.get("SkipLayerNormalization", 0) > 0) == exporter_optimize, ops
    elif target == "cpu":
        assert fusions["multi_head_attention"] + fusions["sdpa_via_mha"] == ops.get("MultiHeadAttention", 0) > 0, (fusions, ops)
        assert "SkipLayerNormalization" not in ops and fusions["sum_into_layer_norm"] > 0, (fusions, ops)
    else:
        assert fusions["skip_layer_normalization"] == ops.get("SkipLayerNormalization", 0) > 0, (fusions, ops)
        assert not {"split_feed_forward", "sum_into_layer_norm"} & set(fusions), fusions  # aot's rules are for cpu
    onnx.checker.check_model(str(path), full_check=True)
    _assert_matches_eager(model, path, inputs, f"{key} {optimize} for {target}")


@pytest.mark.artifact
def test_ort_fusions_have_no_file_level_stage(tmp_path):
    path = tmp_path / "model.onnx"
    write_as_built(torch.fx.symbolic_trace(models.convnet()), models.convnet_inputs(2, 8), None, path)
    before = path.read_bytes()
    with pytest.raises(ExportError, match="optimize: ort_fusions has no file-level stage"):
        optimize_onnx(path, "ort_fusions", None)
    assert path.read_bytes() == before


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


@pytest.mark.artifact
def test_rejected_graph_raises_one_line_and_leaves_nothing(tmp_path):
    gm = torch.fx.symbolic_trace(Rejected())
    path = tmp_path / "out" / "model.onnx"
    path.parent.mkdir()
    with pytest.raises(ExportError) as raised:
        write_as_built(gm, {"x": torch.randn(2, 4)}, {"x": {0: "batch"}}, path)
    message = str(raised.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith("torch.onnx.export rejects the graph for model.onnx:")
    assert "aot_onnx_test.mystery" in message
    assert list(path.parent.iterdir()) == []


@pytest.mark.artifact
def test_opset_is_configurable(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    path = tmp_path / "model.onnx"
    write_as_built(gm, models.convnet_inputs(2, 8), None, path, opset=20)
    proto = onnx.load(path)
    assert {o.domain: o.version for o in proto.opset_import}[""] == 20
    assert all(isinstance(d, int) for value in proto.graph.input for d in _dims(value)), "no dynamic dims asked"


@pytest.mark.artifact
def test_opset_the_converter_cannot_reach_is_an_error(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    with pytest.raises(ExportError, match="opset 17 was asked for but the exporter produced opset 18"):
        write_as_built(gm, models.convnet_inputs(2, 8), None, tmp_path / "model.onnx", opset=17)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.artifact
def test_small_weights_stay_inline_with_external_data_auto(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    path = tmp_path / "model.onnx"
    write_as_built(gm, models.convnet_inputs(2, 8), CONVNET_DIMS, path, external_data="auto")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.artifact
def test_large_weights_go_to_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)  # the forked child inherits it
    model = models.convnet()
    path = tmp_path / "model.onnx"
    write_as_built(torch.fx.symbolic_trace(model), models.convnet_inputs(2, 8), CONVNET_DIMS, path, external_data="auto")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
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
        write_as_built(gm, models.convnet_inputs(2, 8), {"pixels": {0: "batch"}}, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.artifact
def test_run_onnx_names_a_missing_input(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    path = tmp_path / "model.onnx"
    write_as_built(gm, models.convnet_inputs(2, 8), CONVNET_DIMS, path)
    with pytest.raises(ExportError, match="input 'x' is missing"):
        run_onnx(path, {"y": np.zeros((1, 3, 8, 8), dtype=np.float32)})


class PositionTable(torch.nn.Module):
    """Adds a learned table of 8 positions, for sequences of at most 8."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


@pytest.mark.artifact
def test_bounded_dims_keep_their_names_and_hold_over_their_range(tmp_path):
    gm = torch.fx.symbolic_trace(PositionTable())
    path = tmp_path / "model.onnx"
    dims = {"x": {0: "batch", 1: "sequence"}}
    write_as_built(gm, {"x": torch.randn(2, 5, 4)}, dims, path, ranges={"batch": (1, 16), "sequence": (2, 8)})
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


def test_weights_written_by_two_threads_are_the_bytes_of_a_serial_write(tmp_path):
    import onnx_ir as ir

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((64, 48), dtype=np.float32).T, rng.standard_normal((300,), dtype=np.float32),
               rng.standard_normal((5,), dtype=np.float32), rng.standard_normal((128, 32), dtype=np.float32)]
    values = []
    for index, array in enumerate(weights):  # strided and contiguous, above and below the inline threshold
        value = ir.Value(name=f"w{index}", shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.FLOAT))
        value.const_value = ir.Tensor(array, name=f"w{index}")
        values.append(value)
    graph = ir.Graph([], values, nodes=[], initializers=values, opset_imports={"": 18}, name="g")
    model = ir.Model(graph, ir_version=10)
    onnx_export._contiguous_on_write(model)
    (tmp_path / "threads").mkdir()
    (tmp_path / "serial").mkdir()
    onnx_export._save(model, tmp_path / "threads" / "model.onnx", external=True)
    ir.save(model, str(tmp_path / "serial" / "model.onnx"), external_data="model.onnx.data")
    assert sorted(p.name for p in (tmp_path / "threads").iterdir()) == ["model.onnx", "model.onnx.data"]
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "threads" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
    written = onnx.load(tmp_path / "threads" / "model.onnx")
    for tensor, array in zip(written.graph.initializer, weights, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor, base_dir=str(tmp_path / "threads")), array)
