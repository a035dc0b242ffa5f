"""aot.runtime leaves (e.g. OneDNNLinear from prepack_linear_weights) travel as source in module.py."""

from __future__ import annotations

import pytest
import torch

from aot.export import load, save_graph_module
from aot.passes import registry
from aot.tracing import symbolic_trace
from tests.export.isolated import run_isolated


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.mark.artifact
def test_prepacked_linears_save_and_run_with_torch_alone(tmp_path):
    torch.manual_seed(0)
    model = Mlp().eval()
    gm = symbolic_trace(model, input_names=["x"])
    result = registry.get("prepack_linear_weights").create({}).apply(gm)
    runtime_leaves = [n for n in result.graph_module.graph.nodes if n.op == "call_module" and type(result.graph_module.get_submodule(n.target)).__name__ == "OneDNNLinear"]
    assert len(runtime_leaves) == 2, result.graph_module.code

    save_graph_module(result.graph_module, tmp_path / "gm")
    source = (tmp_path / "gm" / "module.py").read_text()
    assert "class OneDNNLinear(torch.nn.Module):" in source
    assert "import aot" not in source and "from aot" not in source

    cases = [{"x": torch.randn(batch, 16)} for batch in (1, 3, 7)]
    standalone = run_isolated({"mlp": (tmp_path / "gm", cases)}, tmp_path)["mlp"]
    reloaded = load(tmp_path / "gm")
    for inputs, raw in zip(cases, standalone):
        with torch.no_grad():
            expected = model(**inputs)
            torch.testing.assert_close(raw, expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(reloaded(**inputs), expected, atol=1e-5, rtol=1e-5)
