"""RemoveIdentity: nn.Identity calls disappear; detach only when asked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import RemoveIdentity
from tests.passes.helpers import assert_matches_eager, call_targets, graph, randn_sets

SHAPES = [(2, 3), (4, 3), (5, 3)]


class WithIdentity(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.skip = nn.Identity()

    def forward(self, x):
        return self.skip(self.fc(x)).detach() + 1


@pytest.mark.parametrize("frontend", ["fx"])
def test_identity_modules_are_removed(frontend):
    torch.manual_seed(0)
    model = WithIdentity().eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    assert call_targets(graph_module)["Identity"] == 1

    result = RemoveIdentity().apply(graph_module)

    assert result.changed == 1 and call_targets(graph_module)["Identity"] == 0
    assert call_targets(graph_module)["detach"] == 1
    assert RemoveIdentity(remove_detach=True).apply(graph_module).changed == 1
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


def test_export_graphs_have_nothing_to_remove_and_say_so():
    torch.manual_seed(0)
    model = WithIdentity().eval()
    graph_module = graph("export", model, torch.randn(*SHAPES[0]))
    result = RemoveIdentity().apply(graph_module)
    assert result.changed == 0 and not result.modified
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))
