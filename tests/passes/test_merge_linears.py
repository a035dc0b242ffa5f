"""MergeLinears: structure, numerics on both frontends, reverse, and each of Optimum 1.27's defects."""

from __future__ import annotations

import operator
import pickle

import pytest
import torch
from torch import nn

from aot.passes import MergeLinears
from tests.passes.helpers import (
    BERT_SHAPES,
    FRONTENDS,
    assert_matches_eager,
    assert_same_tensors,
    bert_inputs,
    call_targets,
    count_calls,
    graph,
    hf_graph,
    randn_sets,
    snapshot,
    tiny_bert,
)

aten = torch.ops.aten
SHAPES = [(2, 2, 8), (3, 5, 8), (5, 7, 8)]
LINEARS = ("Linear", aten.linear.default)


class Attention(nn.Module):
    def __init__(self, bias_free_key: bool = False):
        super().__init__()
        self.query = nn.Linear(8, 4)
        self.key = nn.Linear(8, 6, bias=not bias_free_key)
        self.value = nn.Linear(8, 5)

    def forward(self, x):
        return self.query(x).sum(-1) + self.key(x).mean(-1) * self.value(x).amax(-1)


class TopLevel(nn.Module):
    """Linears directly on the root: Optimum took the parent of 'a' to be 'a' and crashed."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 2, bias=False)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], -1)


class CalledTwice(nn.Module):
    """One layer applied twice to the same input: Optimum deleted it twice and crashed."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.a(x) + self.b(x) * self.a(x)


class AlsoOnOtherInput(nn.Module):
    """'a' reads x (with 'b') and also y: Optimum deleted 'a', leaving the y call dangling."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        y = x * 2 + 1
        return self.a(x) + self.b(x) + self.a(y)


class TwoScopes(nn.Module):
    """Layers of two different blocks read the same input: Optimum put both into the first block."""

    def __init__(self):
        super().__init__()
        self.left = nn.Sequential(nn.Linear(8, 3))
        self.right = nn.Sequential(nn.Linear(8, 4))

    def forward(self, x):
        return self.left(x).sum(-1) + self.right(x).sum(-1)


class KeywordCalls(nn.Module):
    """Layers called as ``layer(input=x)``: Optimum read ``node.args[0]`` and crashed."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.a(input=x) - self.b(input=x)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_merges_three_projections_and_matches_eager(frontend):
    torch.manual_seed(0)
    model = Attention().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))
    assert count_calls(graph_module, *LINEARS) == 3

    result = MergeLinears().apply(graph_module)

    assert result.modified and result.matched == 1 and result.changed == 1
    assert count_calls(graph_module, *LINEARS) == 1
    slices = call_targets(graph_module)[operator.getitem] + call_targets(graph_module)[aten.slice.Tensor]
    assert slices == 3
    assert assert_matches_eager(model, graph_module, randn_sets(*SHAPES)) == 3


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_reverse_restores_parameters_code_and_outputs(frontend):
    torch.manual_seed(0)
    model = Attention(bias_free_key=True).eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))
    before_state = snapshot(graph_module)
    before_outputs = [graph_module(*inputs) for inputs in randn_sets(*SHAPES)]
    transformation = MergeLinears()
    transformation(graph_module)
    assert transformation.get_transformed_nodes(graph_module)

    result = transformation.apply(graph_module, reverse=True)

    assert result.modified
    assert not transformation.get_transformed_nodes(graph_module)
    assert_same_tensors(graph_module, before_state)
    for inputs, expected in zip(randn_sets(*SHAPES), before_outputs):
        torch.testing.assert_close(graph_module(*inputs), expected, rtol=0, atol=0)


def test_bias_free_layer_comes_back_without_bias():
    torch.manual_seed(0)
    model = Attention(bias_free_key=True).eval()
    graph_module = graph("fx", model, torch.randn(2, 3, 8))
    assert graph_module.key.bias is None

    MergeLinears()(graph_module)
    MergeLinears()(graph_module, reverse=True)

    assert graph_module.key.bias is None, "reverse invented a zero bias"
    assert graph_module.query.bias is not None


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("model_class", [TopLevel, CalledTwice, KeywordCalls])
def test_optimum_crash_cases_merge_and_match(frontend, model_class):
    torch.manual_seed(0)
    model = model_class().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))
    assert count_calls(graph_module, *LINEARS) >= 2

    result = MergeLinears().apply(graph_module)

    assert result.changed == 1
    assert count_calls(graph_module, *LINEARS) == 1
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))
    MergeLinears()(graph_module, reverse=True)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_layer_also_used_on_another_input_is_kept(frontend):
    torch.manual_seed(0)
    model = AlsoOnOtherInput().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))

    MergeLinears()(graph_module)

    assert count_calls(graph_module, *LINEARS) == 2  # the merged one, and 'a' on y
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))
    MergeLinears()(graph_module, reverse=True)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_layers_of_different_scopes_are_not_merged_unless_asked(frontend):
    torch.manual_seed(0)
    model = TwoScopes().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8))
    assert count_calls(graph_module, *LINEARS) == 2

    result = MergeLinears().apply(graph_module)

    assert not result.modified and result.changed == 0
    assert any("different scopes" in note for note in result.notes), result.notes
    assert not any(name.startswith("left.") and "merged" in name for name, _ in graph_module.named_modules())

    result = MergeLinears(across_scopes=True).apply(graph_module)
    assert result.changed == 1
    merged = [name for name, _ in graph_module.named_modules() if "merged" in name]
    assert merged == ["merged_0_0"], "the merged layer lives in the common parent, the root"
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_layers_of_different_dtypes_are_not_merged_nor_cast():
    """Optimum cast every merged weight to the first layer's dtype; here layers of another dtype stay apart.

    Eager code cannot feed one tensor to layers of two dtypes without autocast, so the
    graph is built by hand from a module holding a float32 and a float64 layer.
    """
    holder = nn.Module()
    holder.a, holder.b, holder.c = nn.Linear(8, 3), nn.Linear(8, 3).double(), nn.Linear(8, 2)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_module("a", (x,)), g.call_module("b", (x,)), g.call_module("c", (x,))))
    graph_module = torch.fx.GraphModule(holder, g)

    result = MergeLinears().apply(graph_module)

    assert result.changed == 1
    merged = [module for name, module in graph_module.named_modules() if "merged" in name]
    assert len(merged) == 1 and merged[0].weight.dtype == torch.float32 and merged[0].out_features == 5
    assert graph_module.b.weight.dtype == torch.float64


def test_merged_name_is_a_valid_identifier_and_module_pickles():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    model.add_module("heads", nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 3)]))

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 3)])

        def forward(self, x):
            return self.heads[0](x).sum(-1) + self.heads[1](x).sum(-1)

    heads = Heads().eval()
    graph_module = graph("fx", heads, torch.randn(2, 3, 8))

    MergeLinears()(graph_module)

    merged_node = next(n for n in graph_module.graph.nodes if MergeLinears().transformed(n))
    assert all(atom.isidentifier() for atom in merged_node.target.split(".")), merged_node.target
    reloaded = pickle.loads(pickle.dumps(graph_module))
    x = torch.randn(3, 8)
    torch.testing.assert_close(reloaded(x), heads(x))


def test_eager_model_is_never_modified():
    torch.manual_seed(0)
    model = Attention(bias_free_key=True).eval()
    saved = snapshot(model)
    modules_before = dict(model.named_modules())
    graph_module = graph("fx", model, torch.randn(2, 3, 8))
    assert graph_module.get_submodule("query") is model.query  # the precondition: tracing shares modules

    MergeLinears()(graph_module)
    MergeLinears()(graph_module, reverse=True)

    assert dict(model.named_modules()) == modules_before
    assert_same_tensors(model, saved)


def test_min_group_size_option_and_notes():
    torch.manual_seed(0)
    model = Attention().eval()
    graph_module = graph("fx", model, torch.randn(2, 3, 8))

    result = MergeLinears(min_group_size=4).apply(graph_module)

    assert not result.modified and result.matched == 1 and result.changed == 0
    assert "fewer than min_group_size" in result.notes[0]


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_bert_merges_query_key_value(frontend, attn_implementation):
    model = tiny_bert(attn_implementation)
    graph_module = hf_graph(frontend, model, bert_inputs(2, 7))
    linears_before = count_calls(graph_module, *LINEARS)
    state_before = snapshot(graph_module)

    result = MergeLinears().apply(graph_module)

    assert result.changed == 2, result.notes  # one q/k/v group per layer
    assert count_calls(graph_module, *LINEARS) == linears_before - 4
    inputs = [bert_inputs(b, s, seed=i) for i, (b, s) in enumerate(BERT_SHAPES)]
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
    MergeLinears()(graph_module, reverse=True)
    assert count_calls(graph_module, *LINEARS) == linears_before
    assert_same_tensors(graph_module, state_before)
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
