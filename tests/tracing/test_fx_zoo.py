"""The fx frontend on the model zoo: module-level graphs that match eager at three shapes."""

from __future__ import annotations

import json

import pytest
import torch
from transformers.pytorch_utils import Conv1D

from aot.tracing import Scope, symbolic_trace
from tests.tracing.tracing_zoo import ZOO, assert_matches_eager

MODULE_LEAVES = (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d, Conv1D)


@pytest.mark.full
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(ZOO))
def test_fx_trace_matches_eager(name, attn):
    model, input_names, make_inputs = ZOO[name](attn)
    gm = symbolic_trace(model, input_names)

    modules = dict(gm.named_modules())
    leaves = [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(modules[n.target], MODULE_LEAVES)]
    assert leaves, "the graph should keep Linear/Conv layers as call_module nodes"
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == input_names
    assert all(isinstance(n.meta["scope"], Scope) for n in gm.graph.nodes)
    assert all(n.meta["scope"].module_path == n.target for n in leaves)
    assert all(isinstance(n.meta["val"], torch.Tensor) for n in leaves)
    report = gm.meta["trace_report"]
    json.dumps(report)
    assert report["frontend"] == "fx" and report["baked_constants"] == []

    assert_matches_eager(model, gm, make_inputs)
