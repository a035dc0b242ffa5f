"""write_onnx: once the ONNX model is written, nothing of the export holds the graph's weights."""

from __future__ import annotations

import gc
import weakref

import onnx
from onnx import numpy_helper

from aot.export import write_onnx

from . import models


def test_the_weights_are_freed_with_the_graph_after_an_export_with_fusions(tmp_path):
    gm = models.fx_graph(models.tiny_bert(), ["input_ids", "attention_mask"])
    weight = weakref.ref(gm.get_submodule("encoder.layer.0.intermediate.dense").weight)
    path = tmp_path / "model.onnx"
    written = write_onnx(gm, path, models.text_inputs(2, 7), models.TEXT_DIMS, ort_fusions="cpu")
    assert written.paths == [path]
    assert written.fusions["multi_head_attention"] == 2, written.fusions  # the rewriter ran on this graph
    stored = sum(numpy_helper.to_array(tensor).nbytes for tensor in onnx.load(str(path)).graph.initializer)
    weights = sum(p.numel() * p.element_size() for p in gm.parameters())
    assert stored >= 0.9 * weights, (stored, weights)  # the weights are in the file (a few fold into constants)
    del gm
    gc.collect()
    assert weight() is None, "onnxscript's rewrite rules still reach the graph's weights"
