"""An int4 decoder ships as int4 in both artifacts: packed codes on disk, torch's int4 kernel, ONNX Runtime's MatMulNBits."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors
import torch

from aot.builder.spine import build
from aot.export.graph_module_artifact import load_standalone
from tests.decoding.plain_loop import plain_onnx_runtime_greedy
from tests.ort_int8 import ort_u8s8_sums_exact

pytestmark = pytest.mark.full  # two builds of llama_int4.yaml at its shipped size (its layer counts are asserted)

RECIPES = Path(__file__).parents[2] / "recipes"


@pytest.fixture(scope="module")
def int4_build(tmp_path_factory) -> Path:
    """llama_int4.yaml computing in float32 (`activations: float`: MatMulNBits at accuracy_level 0, F.linear in module.py)."""
    root = tmp_path_factory.mktemp("int4")
    shutil.copytree(RECIPES / "data", root / "data")
    text = (RECIPES / "llama_int4.yaml").read_text()
    assert "{bits: 4, group_size: 32}" in text, "precondition: the recipe's int4 layers, activations at their default"
    (root / "int4.yaml").write_text(text.replace("{bits: 4, group_size: 32}", "{bits: 4, group_size: 32, activations: float}"))
    return Path(build(root / "int4.yaml", root / "out").output)


def test_the_saved_module_holds_packed_int4_codes(int4_build):
    meta = (int4_build / "graph_module" / "module.py").read_text()
    assert "class WeightOnlyLinear" in meta and "activations='float'" in meta
    with safetensors.safe_open(int4_build / "graph_module" / "weights.safetensors", "pt") as weights:
        entries = {name: (weights.get_slice(name).get_dtype(), weights.get_slice(name).get_shape()) for name in weights.keys()}
    scales = sorted(name[: -len(".weight_scale")] for name in entries if name.endswith(".weight_scale"))
    assert len(scales) == 6 * 4 + 1, "q/k/v, o, gate/up and down of 6 layers, and lm_head"
    for layer in scales:
        (dtype, (rows, half)), (_, (scale_rows, groups)) = entries[f"{layer}.weight"], entries[f"{layer}.weight_scale"]
        assert dtype == "U8" and scale_rows == rows and groups * 32 == 2 * half, (layer, entries[f"{layer}.weight"])
    embeddings = [entry for name, entry in entries.items() if name.endswith("embed_tokens.weight")]
    assert [dtype for dtype, _ in embeddings] == ["F32"], "embedding tables stay float"


def test_the_onnx_model_runs_every_quantized_layer_as_matmul_nbits_on_the_same_codes(int4_build):
    model = onnx.load(str(int4_build / "model.onnx"))
    onnx.checker.check_model(model)
    nodes = [node for node in model.graph.node if node.op_type == "MatMulNBits"]
    assert len(nodes) == 25 and all(node.domain == "com.microsoft" for node in nodes)
    attributes = {a.name: a.i for a in nodes[0].attribute}
    assert attributes["bits"] == 4 and attributes["block_size"] == 32 and attributes["accuracy_level"] == 0
    assert not any(node.op_type == "MatMul" and "proj" in node.name for node in model.graph.node)
    initializers = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    with safetensors.safe_open(int4_build / "graph_module" / "weights.safetensors", "np") as weights:
        down = next(name[: -len(".weight")] for name in weights.keys() if name.endswith("layers.0.mlp.down_proj.weight"))
        codes = weights.get_tensor(f"{down}.weight")
    onnx_codes = next(value for name, value in initializers.items() if name.startswith(down) and value.dtype == np.uint8)
    np.testing.assert_array_equal(onnx_codes.reshape(codes.shape), codes)


def test_a_plain_onnx_runtime_loop_makes_the_graph_modules_tokens(int4_build):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 30522, (2, 11))
    mask = np.ones_like(prompt)
    mask[1, :3], prompt[1, :3] = 0, 0  # the second row is 3 tokens shorter: left padding
    module = load_standalone(int4_build / "graph_module")
    with torch.no_grad():
        expected = module.generate(torch.from_numpy(prompt), torch.from_numpy(mask), 24)[:, 11:].numpy()
    tokens, _ = plain_onnx_runtime_greedy(int4_build / "model.onnx", prompt, mask, 24)
    np.testing.assert_array_equal(tokens, expected)
    assert len({int(t) for t in expected[0]}) > 4, "a loop stuck on one token would prove little"
    generation = json.loads((int4_build / "manifest.json").read_text())["generation"]
    assert collections.Counter(g["artifact"] for g in generation if "metrics" in g) == {"onnx": 1, "graph_module": 1}


@pytest.mark.parametrize("bits,symmetric,zero_point", [(4, False, "integer"), (4, False, "float"), (8, True, "integer")])
def test_asymmetric_int4_and_int8_layers_run_in_onnx_runtime_as_in_torch(tmp_path, bits, symmetric, zero_point):
    """Zero points two a byte, a row of three groups padded to whole bytes; float zero points as MatMulNBits' default
    zero point and a product of group sums by the offsets; int8 codes shifted by 128: ONNX Runtime (MatMulNBits at
    accuracy_level 0) computes the float formula of the same codes, at three shapes."""
    import onnxruntime

    from aot.passes import QuantizeLinearWeights
    from aot.runtime import WeightOnlyLinear
    from tests.passes.helpers import fx_graph

    from .as_built import write_as_built

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 80), torch.nn.SiLU(), torch.nn.Linear(80, 48, bias=False)).eval()
    with torch.no_grad():
        model[0].weight.add_(0.05)  # off-centre weights: the fitted zero points differ from 8
    graph_module = fx_graph(model, torch.randn(2, 96))
    QuantizeLinearWeights(bits=bits, group_size=32, symmetric=symmetric, zero_point=zero_point, activations="float")(graph_module)
    layers = [module for module in graph_module.modules() if isinstance(module, WeightOnlyLinear)]
    assert len(layers) == (1 if bits == 4 else 2), "precondition: 80 inputs are no whole number of groups of 32 for int4"
    if bits == 4:
        assert layers[0].weight_zero.shape == (80, 3) and len(set(layers[0].weight_zero.flatten().tolist())) > 1
    path = tmp_path / "model.onnx"
    write_as_built(graph_module, {"input": torch.randn(2, 96)}, {"input": {0: "batch"}}, path)
    model_proto = onnx.load(str(path))
    onnx.checker.check_model(model_proto)
    matmul_nbits = [node for node in model_proto.graph.node if node.op_type == "MatMulNBits"]
    assert len(matmul_nbits) == len(layers)
    if bits == 8:  # stored shifted, one layer at a time as the file is written: the module's codes plus 128
        initializers = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model_proto.graph.initializer}
        for node, layer in zip(matmul_nbits, layers):
            stored = initializers[node.input[1]]
            assert stored.dtype == np.uint8
            np.testing.assert_array_equal(stored.reshape(layer.out_features, -1).astype(np.int16) - 128, layer.weight.numpy())
    if zero_point == "float":  # MatMulNBits with float zero points dequantizes the whole weight at every call
        assert [len(node.input) for node in matmul_nbits] == [3], "the default zero point"
        assert {"ReduceSum", "MatMul"} <= {node.op_type for node in model_proto.graph.node}, "the offsets' product"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rows in (1, 3, 17):
        x = torch.randn(rows, 96)
        with torch.no_grad():
            want = graph_module(x)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_a_decoder_built_with_int8_prompts_branches_and_passes_its_gate(tmp_path):
    """llama_int4.yaml with `export.onnx.int4_prompts: int8_gemm`: every int4 layer an If (logits: last keeps the lm_head
    on MatMulNBits alone), the fidelity gate met by both artifacts, and the keys and values a prompt caches through ONNX
    Runtime's int8 GEMM those of the GraphModule (the same int8 weights and per-row activations), where a decode step's
    new ones differ (MatMulNBits against torch's int4 kernel)."""
    import onnxruntime

    shutil.copytree(RECIPES / "data", tmp_path / "data")
    text = (RECIPES / "llama_int4.yaml").read_text()
    assert "export:" not in text and "logits: last" in text, "precondition: the recipe sets no export options"
    (tmp_path / "prompts.yaml").write_text(text.rstrip() + "\nexport:\n  onnx:\n    int4_prompts: int8_gemm\n")
    built = Path(build(tmp_path / "prompts.yaml", tmp_path / "out").output)
    model = onnx.load(str(built / "model.onnx"))
    assert [node.op_type for node in model.graph.node].count("If") == 6 * 4
    assert [node.op_type for node in model.graph.node].count("MatMulNBits") == 1, "the lm_head"
    gate = [entry for entry in json.loads((built / "manifest.json").read_text())["generation"] if "metrics" in entry]
    assert {entry["artifact"] for entry in gate} == {"onnx", "graph_module"} and all(entry["ok"] for entry in gate)

    module = load_standalone(built / "graph_module")
    names = type(module).generate.__globals__
    session = onnxruntime.InferenceSession(str(built / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx_names = [i.name for i in session.get_inputs()]
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 30522, (1, 12)))
    past = list(names["PAST_LAYOUT"].empty(1))
    for length in (12, 1):  # the prompt, then one step on its cache
        step = [ids[:, -length:], torch.ones(1, 12 + (length == 1), dtype=torch.long),
                torch.arange(12 - length + (length == 1), 12 + (length == 1))[None], *past]
        with torch.no_grad():
            outputs = list(module(**dict(zip(names["STEP_INPUTS"], step))).values())
        onnx_outputs = session.run(None, dict(zip(onnx_names, [tensor.numpy() for tensor in step])))
        newest = [(got[..., -length:, :], want[..., -length:, :].numpy()) for got, want in zip(onnx_outputs[1:], outputs[1:])]
        difference = max(np.abs(got - want).max() / np.abs(want).max() for got, want in newest)
        if length == 12:
            if ort_u8s8_sums_exact():  # elsewhere ONNX Runtime's uint8 GEMM saturates (tests/ort_int8.py); the gate held above
                assert difference < 1e-4, f"a prompt's cached keys and values differ by {difference:.2e} of their scale"
        else:
            assert difference > 1e-4, "a step runs MatMulNBits in ONNX Runtime and torch's int4 kernel in module.py"
        past = outputs[1:]
