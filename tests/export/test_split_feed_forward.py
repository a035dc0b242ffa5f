"""split_feed_forward: each MatMul -> BiasGelu -> MatMul block becomes two half-width blocks, same outputs."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import torch
import transformers

from aot.export import optimize_onnx, run_onnx, write_onnx
from aot.outputs import flatten_outputs

from . import models


def _bert(intermediate_size: int) -> transformers.BertModel:
    config = transformers.BertConfig(
        vocab_size=models.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=intermediate_size, max_position_embeddings=64, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def _ops(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def _export(model, path, target):
    gm = models.fx_graph(model, ["input_ids", "attention_mask"])
    return write_onnx(gm, path, models.text_inputs(2, 7), models.TEXT_DIMS, ort_fusions=target)


def test_cpu_target_splits_every_block_and_keeps_the_outputs(tmp_path):
    model = _bert(intermediate_size=64)
    unsplit = _export(model, tmp_path / "cuda.onnx", "cuda")
    assert unsplit.fusions["bias_gelu"] == 2 and "split_feed_forward" not in unsplit.fusions
    assert _ops(tmp_path / "cuda.onnx")["BiasGelu"] == 2  # the precondition: one block per layer

    split = _export(model, tmp_path / "cpu.onnx", "cpu")
    assert split.fusions["split_feed_forward"] == 2
    ops = _ops(tmp_path / "cpu.onnx")
    assert ops["BiasGelu"] == 4
    assert ops["MatMul"] == _ops(tmp_path / "cuda.onnx")["MatMul"] + 2 * 2  # two more per block
    assert len({tuple(t.shape) for b, s in models.TEXT_SHAPES for t in models.text_inputs(b, s).values()}) >= 3
    for batch, sequence in models.TEXT_SHAPES:
        inputs = models.text_inputs(batch, sequence)
        with torch.no_grad():
            want = flatten_outputs(model(**inputs))
        got = run_onnx(tmp_path / "cpu.onnx", inputs)
        for name in want:
            np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-5, rtol=1e-4, err_msg=name)


def test_a_block_of_odd_width_is_left_whole(tmp_path):
    written = _export(_bert(intermediate_size=37), tmp_path / "model.onnx", "cpu")
    assert written.fusions["bias_gelu"] == 2  # the block is there, fused ...
    assert written.fusions["split_feed_forward"] == 0  # ... but has no two equal halves
    assert _ops(tmp_path / "model.onnx")["BiasGelu"] == 2


def test_the_file_level_stage_splits_too(tmp_path):
    gm = models.fx_graph(_bert(intermediate_size=64), ["input_ids", "attention_mask"])
    path = tmp_path / "model.onnx"
    write_onnx(gm, path, models.text_inputs(2, 7), models.TEXT_DIMS)
    assert "BiasGelu" not in _ops(path)
    optimize_onnx(path, "ort_fusions", None, target="cpu")
    assert _ops(path)["BiasGelu"] == 4
    onnx.checker.check_model(str(path), full_check=True)
