"""DeadCodeElimination: unused nodes and the weights only they read go; impure nodes stay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import DeadCodeElimination, MergeLinears
from tests.passes.helpers import FRONTENDS, assert_matches_eager, assert_same_tensors, graph, randn_sets, snapshot

SHAPES = [(2, 4), (3, 4), (6, 4)]


class Wasteful(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        self.unused(x).relu()  # computed and thrown away
        return self.used(x)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_unused_nodes_and_their_weights_are_removed(frontend):
    torch.manual_seed(0)
    model = Wasteful().eval()
    saved = snapshot(model)
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    if frontend == "export":  # torch.export drops dead code itself; add some back
        x = next(n for n in graph_module.graph.nodes if n.op == "placeholder" and n.users)
        with graph_module.graph.inserting_after(x):
            graph_module.graph.call_function(torch.ops.aten.relu.default, (x,))
    nodes_before = len(graph_module.graph.nodes)

    result = DeadCodeElimination().apply(graph_module)

    assert result.modified and len(graph_module.graph.nodes) < nodes_before
    assert not any(name.startswith("unused") for name in graph_module.state_dict())
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)
    assert_same_tensors(model, saved)
    assert not DeadCodeElimination().apply(graph_module).modified


def test_guards_and_in_place_ops_are_kept():
    torch.manual_seed(0)

    class InPlace(nn.Module):
        def forward(self, x):
            y = x.clone()
            y.add_(1)
            return x * 2, y

    model = InPlace()
    graph_module = graph("export", model, torch.randn(*SHAPES[0]))
    guards = [n for n in graph_module.graph.nodes if n.op == "call_module"]

    DeadCodeElimination().apply(graph_module)

    assert [n for n in graph_module.graph.nodes if n.op == "call_module"] == guards
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_leftovers_of_other_passes_are_cleaned():
    torch.manual_seed(0)

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x) * self.b(x)

    model = Pair().eval()
    graph_module = graph("fx", model, torch.randn(*SHAPES[0]))
    MergeLinears()(graph_module)

    DeadCodeElimination().apply(graph_module)

    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))
