"""FuseBatchNorm1dInLinear: both orders, affine=False, the cases that must not fuse, both frontends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import FuseBatchNorm1dInLinear
from tests.passes.helpers import (
    FRONTENDS,
    assert_matches_eager,
    assert_same_tensors,
    count_calls,
    graph,
    randn_sets,
    snapshot,
    with_statistics,
)

aten = torch.ops.aten
SHAPES = [(2, 6), (3, 6), (7, 6)]
BATCH_NORMS = ("BatchNorm1d", aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default)


def _bn(features: int, **options) -> nn.BatchNorm1d:
    return with_statistics(nn.BatchNorm1d(features, **options))


class LinearBn(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = _bn(5, **options)

    def forward(self, x):
        return self.bn(self.fc(x))


class BnLinear(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.bn = _bn(6, **options)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(self.bn(x))


class SharedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = _bn(6)

    def forward(self, x):
        return self.bn(self.fc(x)) + self.fc(x * 2)


class Sequence3d(nn.Module):
    """(N, C, L) input: BatchNorm1d normalises C, the Linear maps L; here C == L by coincidence."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = _bn(6)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("model_class", [LinearBn, BnLinear])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "affine-false"])
def test_fold_matches_eager(frontend, model_class, affine):
    """Optimum crashed on affine=False (and took beta = 1)."""
    torch.manual_seed(0)
    model = model_class(affine=affine).eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    assert count_calls(graph_module, *BATCH_NORMS) == 1

    result = FuseBatchNorm1dInLinear().apply(graph_module)

    assert result.changed == 1 and count_calls(graph_module, *BATCH_NORMS) == 0, result.notes
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_batch_statistics_are_not_folded(frontend):
    torch.manual_seed(0)
    model = LinearBn(track_running_stats=False).eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))

    result = FuseBatchNorm1dInLinear().apply(graph_module)

    assert not result.modified and "batch statistics" in result.notes[0]
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_training_mode_is_not_folded():
    torch.manual_seed(0)
    graph_module = graph("fx", LinearBn().train(), torch.randn(*SHAPES[0]))
    result = FuseBatchNorm1dInLinear().apply(graph_module)
    assert not result.modified and "training mode" in result.notes[0]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_linear_used_elsewhere_keeps_computing_the_same(frontend):
    torch.manual_seed(0)
    model = SharedLinear().eval()
    saved = snapshot(model)
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))

    result = FuseBatchNorm1dInLinear().apply(graph_module)

    assert result.changed == 1
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)
    assert_same_tensors(model, saved)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_three_dimensional_activations_are_not_fused(frontend):
    torch.manual_seed(0)
    model = Sequence3d().eval()
    graph_module = graph(frontend, model, torch.randn(2, 6, 6))

    result = FuseBatchNorm1dInLinear().apply(graph_module)

    assert not result.modified and "2-D" in result.notes[0]
    assert_matches_eager(model, graph_module, randn_sets((2, 6, 6), (3, 6, 6), (4, 6, 6)))
