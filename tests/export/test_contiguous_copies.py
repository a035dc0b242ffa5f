"""contiguous() before a reshape becomes a copy for the ONNX exporter: Swin exports with a dynamic batch."""

from __future__ import annotations

import pytest
import numpy as np
import torch
import torch.fx
import transformers

from aot.export import run_onnx
from aot.export.contiguous_copies import with_explicit_copies
from aot.tracing import symbolic_trace
from aot.tracing.outputs import flatten_outputs

from .as_built import write_as_built


class Reshaped(torch.nn.Module):
    """One contiguous() read by a reshape (replaced), one whose reader writes in place (kept)."""

    def forward(self, x):
        merged = x.transpose(1, 2).contiguous().reshape(x.shape[0], -1)
        kept = x.transpose(1, 2).contiguous()
        kept.mul_(2)
        return merged, kept


def _contiguous_calls(gm: torch.fx.GraphModule) -> int:
    return sum(node.op == "call_method" and node.target == "contiguous" for node in gm.graph.nodes)


def test_only_a_contiguous_read_by_reshapes_becomes_a_copy_in_a_new_graph():
    gm = torch.fx.symbolic_trace(Reshaped())
    assert _contiguous_calls(gm) == 2

    copied = with_explicit_copies(gm)

    assert _contiguous_calls(gm) == 2, "the graph handed in is unchanged"
    assert _contiguous_calls(copied) == 1 and sum(node.target == "clone" for node in copied.graph.nodes) == 1
    x = torch.randn(3, 4, 5)
    for want, got in zip(gm(x), copied(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    untouched = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    assert with_explicit_copies(untouched) is untouched


@pytest.mark.artifact
def test_swin_exports_to_onnx_with_a_dynamic_batch_and_matches_eager(tmp_path):
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                                     encoder_stride=8)
    torch.manual_seed(0)
    model = transformers.SwinModel(config).eval()
    gm = symbolic_trace(model, ["pixel_values"])
    path = tmp_path / "model.onnx"

    write_as_built(gm, {"pixel_values": torch.randn(2, 3, 32, 32)}, {"pixel_values": {0: "batch"}}, path, ranges={"batch": (1, 8)})

    for batch in (1, 3, 8):
        pixels = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            want = flatten_outputs(model(pixel_values=pixels))
        got = run_onnx(path, {"pixel_values": pixels})
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
