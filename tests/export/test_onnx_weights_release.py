"""The build's ONNX export in a forked child: once written, nothing of the export holds the graph's weights.

In process, torch.onnx and onnxscript keep the exported graph (and so the weights) reachable;
the child takes all of that with it when it exits."""

from __future__ import annotations

import gc
import weakref

import onnx
import pytest
import torch
import transformers
from onnx import numpy_helper

from aot.process.forked import can_fork

from . import models
from .as_built import write_as_built


def _bert_with_unfoldable_weights() -> transformers.BertModel:
    """Weights above constant folding's size limit (8192 elements), as in any real model: the
    rewriter must leave them as they are, so only the export's own references could keep them."""
    config = transformers.BertConfig(
        vocab_size=models.VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=64, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


@pytest.mark.artifact
@pytest.mark.skipif(not can_fork(), reason="fork is used on Linux only")
def test_the_weights_are_freed_with_the_graph_after_a_forked_export_with_fusions(tmp_path):
    gm = models.fx_graph(_bert_with_unfoldable_weights(), ["input_ids", "attention_mask"])
    weight = weakref.ref(gm.get_submodule("encoder.layer.0.intermediate.dense").weight)
    path = tmp_path / "model.onnx"
    fusions = write_as_built(gm, models.text_inputs(2, 7), models.TEXT_DIMS, path, optimize="ort_fusions", target="cpu")
    # The rewriter ran on this graph: both layers' attention became MultiHeadAttention (torch 2.15 exports
    # layer 0 in a form that only onnxscript's SDPA-via-MHA rule takes).
    assert fusions["multi_head_attention"] + fusions["sdpa_via_mha"] == 2, fusions
    proto = onnx.load(str(path))  # with the weights from model.onnx.data
    stored = sum(numpy_helper.to_array(tensor).nbytes for tensor in proto.graph.initializer)
    weights = sum(p.numel() * p.element_size() for p in gm.parameters())
    assert stored >= 0.9 * weights, (stored, weights)  # the weights are in the file (a few fold into constants)
    del gm, proto
    gc.collect()
    assert weight() is None, "the export left a reference to the graph's weights in this process"
