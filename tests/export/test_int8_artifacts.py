"""An int8 graph ships as int8 in both artifacts: int8 weights on disk, torch's int8 GEMM, ONNX's int8 ops."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime
import pytest
import safetensors
import torch

from aot.export import save_graph_module
from aot.export.graph_module_artifact import load_standalone
from aot.passes import MergeLinears, QuantizeLinearInt8
from aot.runtime import Int8DynamicLinear
from aot.tracing.outputs import flatten_outputs
from tests.ort_int8 import skip_unless_ort_u8s8_sums_exact

from . import models
from .as_built import write_as_built


@pytest.fixture(scope="module", params=["per_tensor", "per_token"])
def int8_bert(request):
    bert = models.tiny_bert()
    graph_module = MergeLinears()(models.fx_graph(bert, ["input_ids", "attention_mask"]))
    QuantizeLinearInt8(skip=["pooler.*"], activations=request.param)(graph_module)
    layers = [name for name, module in graph_module.named_modules() if isinstance(module, Int8DynamicLinear)]
    assert len(layers) == 8, "precondition: every encoder linear is int8, the pooler is not"
    return graph_module, layers


def _outputs(module, inputs):
    with torch.no_grad():
        return flatten_outputs(module(**inputs))


def test_the_saved_module_holds_int8_weights_and_runs_the_same_kernel(int8_bert, tmp_path):
    graph_module, layers = int8_bert
    save_graph_module(graph_module, tmp_path / "gm")

    with safetensors.safe_open(tmp_path / "gm" / "weights.safetensors", "pt") as weights:
        dtypes = {name: weights.get_slice(name).get_dtype() for name in weights.keys()}
    for layer in layers:
        assert dtypes[f"{layer}.weight"] == "I8" and dtypes[f"{layer}.weight_scale"] == "F32", layer
    assert dtypes["pooler.dense.weight"] == "F32"
    assert "class Int8DynamicLinear" in (tmp_path / "gm" / "module.py").read_text()

    shipped = load_standalone(tmp_path / "gm")
    for shape in models.TEXT_SHAPES:
        inputs = models.text_inputs(*shape)
        want, got = _outputs(graph_module, inputs), _outputs(shipped, inputs)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6)  # float layers may sum in another order


def _op_types(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph.node)


@pytest.mark.artifact
@pytest.mark.parametrize("optimize", [None, "ort_fusions"])
def test_the_onnx_model_quantises_like_the_graph_and_ort_runs_int8_kernels(int8_bert, tmp_path, optimize):
    graph_module, layers = int8_bert
    path = tmp_path / "model.onnx"
    options = {"optimize": optimize} if optimize else {}
    write_as_built(graph_module, models.text_inputs(2, 7), models.TEXT_DIMS, path, **options)

    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    ops = _op_types(model)
    per_tensor = graph_module.get_submodule(layers[0]).activations == "per_tensor"
    quantizer = "DynamicQuantizeLinear" if per_tensor else "Round"  # per token: Abs, ReduceMax, Div, Mul, Round, Add, Cast
    assert ops[quantizer] == len(layers) and ops["MatMulInteger"] == len(layers), ops
    int8_initializers = [tensor for tensor in model.graph.initializer if tensor.data_type == onnx.TensorProto.INT8]
    assert len(int8_initializers) == len(layers)

    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as_loaded.onnx")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    as_loaded = _op_types(onnx.load(tmp_path / "as_loaded.onnx"))
    int8_kernel = "DynamicQuantizeMatMul" if per_tensor else "MatMulInteger"  # one scale a row: no fused kernel takes it
    assert as_loaded[int8_kernel] == len(layers), as_loaded

    skip_unless_ort_u8s8_sums_exact()
    for shape in models.TEXT_SHAPES:
        inputs = models.text_inputs(*shape)
        want = _outputs(graph_module, inputs)
        got = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
        np.testing.assert_allclose(got[0], want["last_hidden_state"].numpy(), rtol=1e-4, atol=1e-4)
