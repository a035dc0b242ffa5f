"""What the passes did is visible in the artifacts, and a reversible pass can be reversed after save + load."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch

from aot.export import export_onnx, load, save_graph_module
from aot.outputs import flatten_outputs
from aot.passes import FuseBatchNorm2dInConv2d, MergeLinears

from . import models


def _linear_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.Linear))


def _op_types(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(path).graph.node)


@pytest.mark.slow
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

    export_onnx(plain, tmp_path / "plain.onnx", inputs, models.TEXT_DIMS)
    export_onnx(merged, tmp_path / "merged.onnx", inputs, models.TEXT_DIMS)
    plain_ops, merged_ops = _op_types(tmp_path / "plain.onnx"), _op_types(tmp_path / "merged.onnx")
    assert merged_ops["MatMul"] + merged_ops["Gemm"] == plain_ops["MatMul"] + plain_ops["Gemm"] - 4


def test_fused_batch_norm_leaves_no_batch_normalization(tmp_path):
    # The exporter's own optimiser (onnxscript) folds Conv + BatchNormalization too, so the ONNX of the
    # unfused graph is no precondition; the graph itself is.
    gm = torch.fx.symbolic_trace(models.convnet())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in gm.modules()), "precondition"
    fused = FuseBatchNorm2dInConv2d()(gm)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    export_onnx(fused, tmp_path / "fused.onnx", models.convnet_inputs(2, 8), None)
    ops = _op_types(tmp_path / "fused.onnx")
    assert ops["Conv"] == 1 and ops["BatchNormalization"] == 0
