"""RemoveRedundantReshapes: same-shape reshapes go, reshape chains collapse, real reshapes stay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import RemoveRedundantReshapes
from tests.passes.helpers import FRONTENDS, assert_matches_eager, graph, randn_sets

SHAPES = [(2, 3, 4), (3, 5, 4), (4, 2, 4)]


class Reshapes(nn.Module):
    def forward(self, x):
        same = x.view(x.shape)
        flat = same.reshape(-1, 4).reshape(x.shape[0], -1)
        return flat * 2


def _reshapes(graph_module):
    return sum(1 for n in graph_module.graph.nodes if str(n.target) in ("view", "reshape", "aten.view.default", "aten.reshape.default"))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_same_shape_views_and_chains_are_removed(frontend):
    model = Reshapes()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    before = _reshapes(graph_module)
    assert before == 3

    result = RemoveRedundantReshapes().apply(graph_module)

    assert result.modified and result.changed == 2
    assert _reshapes(graph_module) == 1
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)
