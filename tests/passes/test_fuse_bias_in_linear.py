"""FuseBiasInLinear: structure, numerics on both frontends, reverse, and Optimum 1.27's defects."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import FuseBiasInLinear
from tests.passes.helpers import (
    BERT_SHAPES,
    FRONTENDS,
    assert_matches_eager,
    assert_same_tensors,
    bert_inputs,
    count_calls,
    graph,
    hf_graph,
    randn_sets,
    snapshot,
    tiny_bert,
)

aten = torch.ops.aten
SHAPES = [(2, 2, 6), (3, 5, 6), (4, 7, 6)]
PADS = (torch.nn.functional.pad, aten.constant_pad_nd.default)


class Mlp(nn.Module):
    def __init__(self, out_features: int = 4):
        super().__init__()
        self.up = nn.Linear(6, 5)
        self.down = nn.Linear(5, out_features)
        self.no_bias = nn.Linear(6, out_features, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + self.no_bias(x)


class CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return self.fc(torch.tanh(self.fc(x)))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_biases_are_folded_and_outputs_match(frontend):
    torch.manual_seed(0)
    model = Mlp().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 6))
    assert count_calls(graph_module, *PADS) == 0

    result = FuseBiasInLinear().apply(graph_module)

    assert result.modified and result.changed == 2  # the bias-free layer is left alone
    assert count_calls(graph_module, *PADS) == 2
    assert all(
        getattr(module, "bias", None) is None for name, module in graph_module.named_modules() if isinstance(module, nn.Linear)
    )
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("out_features", [4, 1])
def test_reverse_restores_parameters_and_outputs(frontend, out_features):
    """Optimum's reverse squeezed the bias: with out_features == 1 it came back 0-d."""
    torch.manual_seed(0)
    model = Mlp(out_features).eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 6))
    state = snapshot(graph_module)

    FuseBiasInLinear()(graph_module)
    FuseBiasInLinear()(graph_module, reverse=True)

    assert count_calls(graph_module, *PADS) == 0
    assert_same_tensors(graph_module, state)  # shapes included: the bias of 'down' is (out_features,)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


def test_the_callers_linear_is_untouched_and_the_new_one_is_consistent():
    """Optimum set weight/bias on the shared module: the eager model broke and in_features went stale."""
    torch.manual_seed(0)
    model = Mlp().eval()
    saved = snapshot(model)
    graph_module = graph("fx", model, torch.randn(2, 3, 6))
    assert graph_module.get_submodule("up") is model.up

    FuseBiasInLinear()(graph_module)

    assert_same_tensors(model, saved)
    assert model.up.bias is not None and model.up.in_features == 6
    fused = graph_module.get_submodule("up")
    assert fused is not model.up
    assert fused.in_features == 7 == fused.weight.shape[1] and fused.bias is None
    x = torch.randn(3, 6)
    torch.testing.assert_close(model(x), graph_module(x))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_layer_called_twice_is_fused_once(frontend):
    torch.manual_seed(0)
    model = CalledTwice().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 6))

    result = FuseBiasInLinear().apply(graph_module)

    assert result.changed == 2 and count_calls(graph_module, *PADS) == 2
    weights = {p.shape for n, p in graph_module.named_parameters() if "fc" in n}
    assert weights == {torch.Size([6, 7])}
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))
    FuseBiasInLinear()(graph_module, reverse=True)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
def test_bert(frontend):
    model = tiny_bert("sdpa")
    graph_module = hf_graph(frontend, model, bert_inputs(2, 7))
    state = snapshot(graph_module)

    result = FuseBiasInLinear().apply(graph_module)

    assert result.changed >= 12, result.notes
    inputs = [bert_inputs(b, s, seed=i) for i, (b, s) in enumerate(BERT_SHAPES)]
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
    FuseBiasInLinear()(graph_module, reverse=True)
    assert_same_tensors(graph_module, state)
