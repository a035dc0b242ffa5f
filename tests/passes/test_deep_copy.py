"""DeepCopy: an independent copy that keeps marks (so it can be reversed) and reports no modification."""

from __future__ import annotations

import pytest
import torch

from aot.passes import DeepCopy, MergeLinears
from tests.passes.helpers import FRONTENDS, LinearPair, assert_matches_eager, graph, randn_sets


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_copy_is_independent_keeps_marks_and_is_unmodified(frontend):
    torch.manual_seed(0)
    model = LinearPair().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 4))
    MergeLinears()(graph_module)

    result = DeepCopy().apply(graph_module)
    copy = result.graph_module

    assert copy is not graph_module and not result.modified
    assert copy.code == graph_module.code
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(copy.parameters(), graph_module.parameters()))
    MergeLinears()(copy, reverse=True)  # reversing the copy works and leaves the original merged
    assert MergeLinears().get_transformed_nodes(graph_module) and not MergeLinears().get_transformed_nodes(copy)
    for module in (copy, graph_module):
        assert_matches_eager(model, module, randn_sets((2, 2, 4), (3, 5, 4), (4, 6, 4)))
