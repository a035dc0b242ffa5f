"""What the passes did is visible in the artifacts, and a reversible pass can be reversed after save + load."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from aot.export import load, save_graph_module
from aot.passes import FuseBatchNorm2dInConv2d, MergeLinears
from aot.tracing.outputs import flatten_outputs

from . import models
from .as_built import write_as_built


def _linear_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.Linear))


def _op_types(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(path).graph.node)


@pytest.mark.artifact
def test_merged_linears_reverse_after_reload_and_show_in_onnx(tmp_path):
    bert = models.tiny_bert()
    plain = models.fx_graph(bert, ["input_ids", "attention_mask"])
    merge = MergeLinears()
    merged = merge(models.fx_graph(bert, ["input_ids", "attention_mask"]))
    assert _linear_calls(merged) == _linear_calls(plain) - 4, "precondition: q/k/v merged in both layers"

    save_graph_module(merged, tmp_path / "graph_module")
    restored = merge(load(tmp_path / "graph_module"), reverse=True)
    assert _linear_calls(restored) == _linear_calls(plain)
    inputs = models.text_inputs(2, 7)
    with torch.no_grad():
        want, got = flatten_outputs(bert(**inputs)), flatten_outputs(restored(**inputs))
    for name in want:
        torch.testing.assert_close(got[name], want[name])

    write_as_built(plain, inputs, models.TEXT_DIMS, tmp_path / "plain" / "model.onnx")
    write_as_built(merged, inputs, models.TEXT_DIMS, tmp_path / "merged" / "model.onnx")
    plain_ops, merged_ops = _op_types(tmp_path / "plain" / "model.onnx"), _op_types(tmp_path / "merged" / "model.onnx")
    assert merged_ops["MatMul"] + merged_ops["Gemm"] == plain_ops["MatMul"] + plain_ops["Gemm"] - 4


def _conv_weight(path) -> np.ndarray:
    proto = onnx.load(path)
    conv = next(node for node in proto.graph.node if node.op_type == "Conv")
    return next(numpy_helper.to_array(t, base_dir=str(path.parent)) for t in proto.graph.initializer if t.name == conv.input[1])


@pytest.mark.artifact
def test_fused_batch_norm_shows_in_onnx_as_a_conv_with_the_norm_in_its_weights(tmp_path):
    # As the build exports (exporter_optimize: false): the exporter folds nothing, so the ONNX of the
    # unfused graph holds its BatchNormalization, and only the pass takes it out.
    model = models.convnet()
    gm = torch.fx.symbolic_trace(model)
    inputs = models.convnet_inputs(2, 8)
    write_as_built(gm, inputs, None, tmp_path / "plain" / "model.onnx")
    plain_ops = _op_types(tmp_path / "plain" / "model.onnx")
    assert plain_ops["Conv"] == 1 and plain_ops["BatchNormalization"] == 1, "precondition: the norm is in the export"

    fused = FuseBatchNorm2dInConv2d()(gm)
    write_as_built(fused, inputs, None, tmp_path / "fused" / "model.onnx")
    fused_ops = _op_types(tmp_path / "fused" / "model.onnx")
    assert fused_ops["Conv"] == 1 and fused_ops["BatchNormalization"] == 0, fused_ops
    # The norm's scale is in the Conv's weights: gamma / sqrt(running_var + eps), per output channel.
    bn = model.bn
    scale = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().numpy()
    plain_weight, fused_weight = _conv_weight(tmp_path / "plain" / "model.onnx"), _conv_weight(tmp_path / "fused" / "model.onnx")
    np.testing.assert_allclose(fused_weight, plain_weight * scale[:, None, None, None], rtol=1e-5, atol=1e-6)
