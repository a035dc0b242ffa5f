"""RemoveRedundantCasts: casts to the dtype a tensor has go; real conversions stay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import RemoveRedundantCasts
from tests.passes.helpers import FRONTENDS, assert_matches_eager, graph, randn_sets

SHAPES = [(2, 3), (4, 3), (5, 3)]
aten = torch.ops.aten


class Casts(nn.Module):
    def forward(self, x):
        same = x.to(torch.float32).float() + 1
        other = x.to(torch.float64)
        return same, other


def _casts(graph_module):
    return sum(
        1
        for n in graph_module.graph.nodes
        if (n.op == "call_method" and n.target in ("to", "float"))
        or (n.op == "call_function" and n.target in (aten.to.dtype, aten._to_copy.default))
    )


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_only_redundant_casts_are_removed(frontend):
    model = Casts()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    before = _casts(graph_module)
    assert before >= 2

    result = RemoveRedundantCasts().apply(graph_module)

    assert result.modified
    assert _casts(graph_module) == 1  # the float64 conversion
    assert any("changes dtype" in note for note in result.notes)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


def test_without_shape_information_nothing_is_removed():
    graph_module = torch.fx.symbolic_trace(Casts())
    result = RemoveRedundantCasts().apply(graph_module)
    assert not result.modified and all("unknown" in note for note in result.notes)
