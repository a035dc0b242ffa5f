"""ChangeTrueDivToMulByInverse: every spelling of true division, the zero case, exactness, reverse."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from aot.passes import ChangeTrueDivToMulByInverse
from tests.passes.helpers import (
    BERT_SHAPES,
    FRONTENDS,
    assert_matches_eager,
    bert_inputs,
    count_calls,
    graph,
    hf_graph,
    randn_sets,
    tiny_bert,
)

aten = torch.ops.aten
SHAPES = [(2, 3), (4, 5), (6, 7)]
DIVISIONS = (operator.truediv, torch.div, torch.divide, torch.true_divide, "div", "divide", "true_divide", aten.div.Tensor, aten.div.Scalar,
             aten.divide.Tensor, aten.true_divide.Tensor)
MULTIPLICATIONS = (operator.mul, torch.mul, "mul", aten.mul.Tensor, aten.mul.Scalar)


class Spellings(nn.Module):
    """Optimum matched only operator.truediv."""

    def forward(self, x):
        return (
            x / 8.0
            + torch.div(x, 3.0)
            + torch.true_divide(x, 5)
            + x.div(7.0)
            + x.true_divide(2.5)
            + torch.divide(x, other=9.0)
            + x.divide(11.0)
        )


class ZeroDenominator(nn.Module):
    """Optimum computed 1 / 0 and crashed."""

    def forward(self, x):
        return x / 0.0 + x / 2.0


class RoundingModes(nn.Module):
    def forward(self, x):
        return torch.div(x, 3.0, rounding_mode="floor") + x.div(2.0, rounding_mode="trunc")


class ShapeArithmetic(nn.Module):
    def forward(self, x):
        return x * (x.shape[-1] / 49) + x.shape[0] / 3


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_every_spelling_of_true_division_is_rewritten(frontend):
    model = Spellings()
    graph_module = graph(frontend, model, torch.randn(2, 3))
    divisions = count_calls(graph_module, *DIVISIONS)
    assert divisions == 7

    result = ChangeTrueDivToMulByInverse().apply(graph_module)

    assert result.modified and result.matched == 7 and result.changed == 7, result.notes
    assert count_calls(graph_module, *DIVISIONS) == 0
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_zero_denominator_is_kept_with_a_note(frontend):
    model = ZeroDenominator()
    graph_module = graph(frontend, model, torch.randn(2, 3))

    result = ChangeTrueDivToMulByInverse().apply(graph_module)

    assert result.changed == 1 and any("zero" in note for note in result.notes)
    inputs = [(torch.tensor([[-1.0, 0.0, 2.0]]),), (torch.randn(3, 4),), (torch.zeros(2, 2),)]
    for (x,) in inputs:
        torch.testing.assert_close(graph_module(x), model(x), equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_rounding_divisions_are_left_alone(frontend):
    graph_module = graph(frontend, RoundingModes(), torch.randn(2, 3))
    result = ChangeTrueDivToMulByInverse().apply(graph_module)
    assert not result.modified


def test_shape_arithmetic_stays_exact():
    """x.shape[-1] / 49 is Python arithmetic on sizes: 49 * (1/49) is 0.999..., so it is not rewritten."""
    model = ShapeArithmetic()
    graph_module = graph("fx", model, torch.randn(2, 49))
    assert count_calls(graph_module, operator.truediv) == 2

    result = ChangeTrueDivToMulByInverse().apply(graph_module)

    assert result.changed == 0 and all("Python number" in note for note in result.notes), result.notes
    x = torch.randn(3, 49)
    torch.testing.assert_close(graph_module(x), model(x), atol=0, rtol=0)


def test_exact_only_keeps_outputs_bit_identical():
    model = Spellings()
    graph_module = graph("fx", model, torch.randn(2, 3))

    result = ChangeTrueDivToMulByInverse(exact_only=True).apply(graph_module)

    assert result.changed == 1  # only x / 8.0
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_reverse_restores_the_exact_denominator(frontend):
    denominator = 49.0  # 1 / (1 / 49.0) != 49.0 in floating point: Optimum's reverse drifted
    assert 1 / (1 / denominator) != denominator

    class Divide(nn.Module):
        def forward(self, x):
            return torch.div(x, denominator)

    graph_module = graph(frontend, Divide(), torch.randn(2, 3))
    code = graph_module.code
    transformation = ChangeTrueDivToMulByInverse()

    transformation(graph_module)
    assert count_calls(graph_module, *MULTIPLICATIONS) == 1
    transformation(graph_module, reverse=True)

    assert graph_module.code == code
    assert not transformation.get_transformed_nodes(graph_module)


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_bert_has_no_constant_division_and_says_so(frontend, attn_implementation):
    """transformers 5 scales attention scores with a multiplication: nothing to do, reported truthfully."""
    model = tiny_bert(attn_implementation)
    graph_module = hf_graph(frontend, model, bert_inputs(2, 7))
    assert count_calls(graph_module, *DIVISIONS) == 0

    result = ChangeTrueDivToMulByInverse().apply(graph_module)

    assert not result.modified and result.changed == 0
    inputs = [bert_inputs(b, s, seed=i) for i, (b, s) in enumerate(BERT_SHAPES)]
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
