"""ApproximateGelu: every exact GELU becomes the tanh form; the outputs move by the approximation's error only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aot.passes import ApproximateGelu
from tests.passes.helpers import FRONTENDS, graph, randn_sets

SHAPES = [(2, 6), (5, 6), (9, 6)]
aten = torch.ops.aten


class Gelus(nn.Module):
    """An nn.GELU module, F.gelu, and a GELU that already is the tanh form."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + F.gelu(x) + F.gelu(2 * x, approximate="tanh")


def _gelus(graph_module, approximate: str) -> int:
    count = 0
    for node in graph_module.graph.nodes:
        if node.op == "call_module" and isinstance(graph_module.get_submodule(node.target), nn.GELU):
            count += graph_module.get_submodule(node.target).approximate == approximate
        elif node.op == "call_function" and node.target in (F.gelu, aten.gelu.default):
            count += node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") == approximate
    return count


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_every_exact_gelu_becomes_tanh_and_the_tanh_one_is_noted(frontend):
    model = Gelus().eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    assert _gelus(graph_module, "none") == 2 and _gelus(graph_module, "tanh") == 1

    result = ApproximateGelu().apply(graph_module)

    assert result.modified and (result.matched, result.changed) == (3, 2)
    assert _gelus(graph_module, "none") == 0 and _gelus(graph_module, "tanh") == 3
    assert any("already the 'tanh' approximation" in note for note in result.notes), result.notes
    assert not ApproximateGelu.preserves_computation
    graph_module.graph.lint()
    with torch.no_grad():
        for (x,) in randn_sets(*SHAPES):
            want, got = model(x), graph_module(x)
            exact = F.gelu(model.linear(x)) + F.gelu(x)
            tanh = F.gelu(model.linear(x), approximate="tanh") + F.gelu(x, approximate="tanh")
            torch.testing.assert_close(got, want - exact + tanh, atol=1e-6, rtol=1e-6)
            difference = (got - want).abs().max()
            assert 0 < difference < 2e-3, "the tanh form differs from erf by at most ~3e-4 per GELU"


def test_a_shared_gelu_module_stays_exact_for_other_users():
    model = Gelus().eval()
    graph_module = graph("fx", model, torch.randn(*SHAPES[0]))
    ApproximateGelu().apply(graph_module)
    assert model.act.approximate == "none", "the eager model's module is not changed"
    assert not any(isinstance(module, nn.GELU) for module in graph_module.modules()), "the unused module is deleted"
