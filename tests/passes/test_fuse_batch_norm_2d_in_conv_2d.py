"""FuseBatchNorm2dInConv2d: the fold's math, the cases that must not fuse, ResNet, on both frontends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import FuseBatchNorm2dInConv2d
from tests.passes.helpers import (
    FRONTENDS,
    ConvOutputUsedTwice,
    assert_matches_eager,
    assert_same_tensors,
    count_calls,
    graph,
    hf_graph,
    randn_sets,
    snapshot,
    tiny_resnet,
    with_statistics,
)

aten = torch.ops.aten
SHAPES = [(2, 3, 8, 8), (3, 3, 10, 12), (5, 3, 9, 7)]
BATCH_NORMS = ("BatchNorm2d", aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default)


class ConvBn(nn.Module):
    def __init__(self, conv_bias: bool = True, **bn_options):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=conv_bias)
        self.bn = with_statistics(nn.BatchNorm2d(4, **bn_options))

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class ConvUsedTwice(nn.Module):
    """The conv module is also called without batch norm: Optimum replaced it for both calls."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = with_statistics(nn.BatchNorm2d(4))

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x * 2)


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"conv_bias": False},
        {"affine": False},  # Optimum took beta = 1 when affine=False
    ],
    ids=["conv-bias", "no-conv-bias", "affine-false"],
)
def test_fold_matches_eager(frontend, options):
    """With a conv bias, Optimum computed b − μ·s + β instead of (b − μ)·s + β."""
    torch.manual_seed(0)
    model = ConvBn(**options).eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    assert count_calls(graph_module, *BATCH_NORMS) == 1

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert result.modified and result.changed == 1
    assert count_calls(graph_module, *BATCH_NORMS) == 0
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_batch_statistics_are_not_folded(frontend):
    """track_running_stats=False crashed Optimum; it normalises with batch statistics and cannot fold."""
    torch.manual_seed(0)
    model = ConvBn(track_running_stats=False).eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    assert count_calls(graph_module, *BATCH_NORMS, aten._native_batch_norm_legit.no_stats) == 1

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert not result.modified and result.matched == 1
    assert "batch statistics" in result.notes[0]
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_training_mode_is_not_folded():
    """Optimum fused in training mode, where batch norm uses the batch's statistics."""
    torch.manual_seed(0)
    model = ConvBn().train()
    graph_module = graph("fx", model, torch.randn(*SHAPES[0]))
    assert count_calls(graph_module, *BATCH_NORMS) == 1

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert not result.modified and "training mode" in result.notes[0]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_conv_used_elsewhere_keeps_computing_the_same(frontend):
    torch.manual_seed(0)
    model = ConvUsedTwice().eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert result.changed == 1 and count_calls(graph_module, *BATCH_NORMS) == 0
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_conv_output_read_elsewhere_is_not_fused(frontend):
    torch.manual_seed(0)
    model = ConvOutputUsedTwice().eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert not result.modified and "also read by" in result.notes[0]
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_the_callers_model_is_untouched():
    torch.manual_seed(0)
    model = ConvBn().eval()
    saved = snapshot(model)
    graph_module = graph("fx", model, torch.randn(*SHAPES[0]))
    assert graph_module.get_submodule("conv") is model.conv

    FuseBatchNorm2dInConv2d()(graph_module)

    assert_same_tensors(model, saved)
    assert isinstance(model.bn, nn.BatchNorm2d) and graph_module.get_submodule("conv") is not model.conv
    x = torch.randn(*SHAPES[1])
    torch.testing.assert_close(model(x), graph_module(x), atol=1e-5, rtol=1e-5)


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
def test_resnet_all_batch_norms_fused(frontend):
    model = tiny_resnet()
    saved = snapshot(model)
    graph_module = hf_graph(frontend, model, {"pixel_values": torch.randn(2, 3, 32, 32)})
    count = count_calls(graph_module, *BATCH_NORMS)
    assert count >= 5

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert result.changed == count and count_calls(graph_module, *BATCH_NORMS) == 0, result.notes
    inputs = [{"pixel_values": x} for (x,) in randn_sets((2, 3, 32, 32), (3, 3, 32, 32), (4, 3, 32, 32))]
    assert_matches_eager(model, graph_module, inputs, atol=1e-4, rtol=1e-4)
    assert_same_tensors(model, saved)
