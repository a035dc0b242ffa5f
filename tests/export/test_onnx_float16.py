"""float16 ONNX: weights and arithmetic in float16, inputs and outputs as they were, validated as such."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from aot.builder.spine import build
from aot.export import run_onnx
from aot.tracing.outputs import flatten_outputs

from . import models
from .as_built import write_as_built

FLOAT16_ATOL, FLOAT16_RTOL = 2e-2, 1e-2  # the recipe default, validate.float16


def _element_types(path) -> tuple[set[int], list[int]]:
    proto = onnx.load(path)
    return {t.data_type for t in proto.graph.initializer}, [o.type.tensor_type.elem_type for o in proto.graph.output]


@pytest.mark.artifact
def test_float16_model_keeps_float32_outputs_and_matches_eager_at_float16_tolerance(tmp_path):
    model = models.tiny_bert()
    inputs = [models.text_inputs(b, s) for b, s in models.TEXT_SHAPES]
    gm = models.fx_graph(model, ["input_ids", "attention_mask"])
    path = tmp_path / "model.onnx"
    fusions = write_as_built(gm, inputs[0], models.TEXT_DIMS, path, optimize="ort_fusions", target="cuda")  # precision: auto
    assert fusions.get("multi_head_attention", 0) > 0, fusions  # fused before the conversion

    initializer_types, output_types = _element_types(path)
    assert onnx.TensorProto.FLOAT16 in initializer_types
    assert onnx.TensorProto.FLOAT not in initializer_types, "every float weight is float16"
    assert output_types == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT]
    onnx.checker.check_model(str(path), full_check=True)

    assert len({tuple(case["input_ids"].shape) for case in inputs}) == 3
    for case in inputs:
        with torch.no_grad():
            want = flatten_outputs(model(**case))
        got = run_onnx(path, case)
        for name in want:
            assert got[name].dtype == np.float32
            expected = want[name].numpy()
            np.testing.assert_allclose(got[name], expected, atol=FLOAT16_ATOL, rtol=FLOAT16_RTOL, err_msg=name)
            # ... and it is float16 arithmetic, not float32 in disguise
            assert np.abs(got[name] - expected).max() > 1e-5


@pytest.mark.artifact
def test_build_validates_a_float16_onnx_at_the_float16_tolerances(write_recipe, tmp_path):
    from tests.conftest import TINY_BERT

    recipe = write_recipe(TINY_BERT + "export:\n  onnx: {optimize: ort_fusions, target: cuda}\n")
    report = build(recipe, tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    onnx_checks = [v for v in manifest["validation"] if v["artifact"] == "onnx"]
    others = [v for v in manifest["validation"] if v["artifact"] != "onnx"]
    assert len(onnx_checks) >= 3 and others
    assert all((v["atol"], v["rtol"]) == (FLOAT16_ATOL, FLOAT16_RTOL) and v["ok"] for v in onnx_checks)
    assert all((v["atol"], v["rtol"]) == (1e-4, 1e-4) for v in others)
    assert report.onnx_fusions.get("skip_layer_normalization", 0) > 0
    initializer_types, _ = _element_types(tmp_path / "out" / "model.onnx")
    assert onnx.TensorProto.FLOAT16 in initializer_types


@pytest.mark.artifact
def test_float16_without_fusions_and_after_the_transformer_optimizer(tmp_path):
    model = models.tiny_bert()
    inputs = [models.text_inputs(b, s) for b, s in models.TEXT_SHAPES]
    gm = models.fx_graph(model, ["input_ids", "attention_mask"])
    float32_path = tmp_path / "float32" / "model.onnx"
    write_as_built(gm, inputs[0], models.TEXT_DIMS, float32_path)
    assert onnx.TensorProto.FLOAT16 not in _element_types(float32_path)[0]  # the precondition: the export is float32
    for level in ("transformer", "none"):  # converted after the file-level stage's fusions; in memory before the write
        path = tmp_path / level / "model.onnx"
        write_as_built(gm, inputs[0], models.TEXT_DIMS, path, optimize=level, precision="float16")
        initializer_types, output_types = _element_types(path)
        assert onnx.TensorProto.FLOAT16 in initializer_types, level
        assert output_types == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT], level
        for case in inputs:
            with torch.no_grad():
                want = flatten_outputs(model(**case))
            got = run_onnx(path, case)
            for name in want:
                np.testing.assert_allclose(got[name], want[name].numpy(), atol=FLOAT16_ATOL, rtol=FLOAT16_RTOL, err_msg=f"{level} {name}")
