"""compose: order, one lint/recompile, reverse in reverse order, flags, in place or not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import (
    ChangeTrueDivToMulByInverse,
    FuseBatchNorm2dInConv2d,
    FuseBiasInLinear,
    MergeLinears,
    ReversibleTransformation,
    compose,
)
from tests.passes.helpers import FRONTENDS, assert_matches_eager, assert_same_tensors, graph, randn_sets, snapshot

SHAPES = [(2, 2, 8), (3, 5, 8), (4, 7, 8)]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        return (self.q(x) / 2.0) * self.k(x)


def _chain_by_hand(graph_module):
    graph_module = ChangeTrueDivToMulByInverse()(graph_module, lint_and_recompile=False)
    graph_module = MergeLinears()(graph_module, lint_and_recompile=False)
    graph_module = FuseBiasInLinear()(graph_module, lint_and_recompile=False)
    graph_module.graph.lint()
    graph_module.recompile()
    return graph_module


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("inplace", [True, False])
def test_compose_gives_the_code_of_chaining_by_hand(frontend, inplace):
    torch.manual_seed(0)
    model = Block().eval()
    by_hand = _chain_by_hand(graph(frontend, model, torch.randn(2, 3, 8)))
    original = graph(frontend, model, torch.randn(2, 3, 8))
    code_before, state_before = original.code, snapshot(original)

    composed = compose(ChangeTrueDivToMulByInverse(), MergeLinears(), FuseBiasInLinear(), inplace=inplace)(original)

    assert composed.code == by_hand.code
    assert (composed is original) == inplace
    if not inplace:
        assert original.code == code_before
        assert_same_tensors(original, state_before)
    assert_matches_eager(model, composed, randn_sets(*SHAPES))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_reverse_undoes_the_parts_in_reverse_order(frontend):
    torch.manual_seed(0)
    model = Block().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))
    state_before = snapshot(graph_module)
    composition = compose(MergeLinears(), FuseBiasInLinear(), ChangeTrueDivToMulByInverse())

    transformed = composition(graph_module)
    result = composition.apply(transformed, reverse=True)

    assert result.modified
    assert_same_tensors(result.graph_module, state_before)
    assert_matches_eager(model, result.graph_module, randn_sets(*SHAPES))


def test_result_sums_the_parts_and_lints_once(monkeypatch):
    torch.manual_seed(0)
    graph_module = graph("fx", Block().eval(), torch.randn(2, 3, 8))
    lints = []
    original_lint = torch.fx.Graph.lint
    monkeypatch.setattr(torch.fx.Graph, "lint", lambda self: lints.append(1) or original_lint(self))

    result = compose(ChangeTrueDivToMulByInverse(), MergeLinears(), FuseBatchNorm2dInConv2d()).apply(graph_module)

    assert len(lints) == 1
    assert result.modified and result.changed == 2 and result.matched == 2


def test_flags_follow_the_parts():
    reversible = compose(MergeLinears(), ChangeTrueDivToMulByInverse())
    assert isinstance(reversible, ReversibleTransformation) and reversible.preserves_computation

    one_way = compose(MergeLinears(), FuseBatchNorm2dInConv2d())
    assert not isinstance(one_way, ReversibleTransformation)

    class Lossy(ReversibleTransformation):
        def transform(self, graph_module):
            return graph_module

        def reverse(self, graph_module):
            return graph_module

    assert not compose(MergeLinears(), Lossy()).preserves_computation


def test_nothing_to_do_is_reported_as_unmodified():
    graph_module = graph("fx", nn.Sequential(nn.ReLU()), torch.randn(2))
    result = compose(MergeLinears(), ChangeTrueDivToMulByInverse(), inplace=False).apply(graph_module)
    assert not result.modified and result.changed == 0
