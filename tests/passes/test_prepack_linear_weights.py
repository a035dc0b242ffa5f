"""PrepackLinearWeights: structure, GELU/ReLU fusion and its limits, numerics on a small module and BERT, reverse."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from aot.passes import DeadCodeElimination, MergeLinears, PrepackLinearWeights, RemoveDropout, registry
from aot.runtime import OneDNNLinear
from tests.passes.helpers import (
    BERT_INPUT_NAMES,
    export_graph,
    BERT_SHAPES,
    assert_matches_eager,
    assert_same_tensors,
    bert_inputs,
    call_targets,
    count_calls,
    fx_graph,
    randn_sets,
    shape_sets,
    snapshot,
    tiny_bert,
)

F = nn.functional
SHAPES = [(2, 8), (3, 5, 8), (1, 7, 8)]
ACTIVATIONS = ("GELU", F.gelu, torch.relu, F.relu)


class Activations(nn.Module):
    """One linear per fusable activation form, one followed by two users, one called twice, one in float64."""

    def __init__(self):
        super().__init__()
        self.gelu_module = nn.Linear(8, 8)
        self.gelu = nn.GELU()
        self.gelu_tanh = nn.Linear(8, 8)
        self.relu_function = nn.Linear(8, 8, bias=False)
        self.two_users = nn.Linear(8, 8)
        self.twice = nn.Linear(8, 8)

    def forward(self, x):
        a = self.gelu(self.gelu_module(x))
        b = F.gelu(self.gelu_tanh(a), approximate="tanh")
        c = torch.relu(self.relu_function(b))
        d = self.two_users(c)
        e = F.gelu(d) + d
        return F.gelu(self.twice(e)) + self.twice(c)


def _packed(graph_module):
    return {name: module.activation for name, module in graph_module.named_modules() if isinstance(module, OneDNNLinear)}


def test_linears_become_onednn_linears_with_their_activation_fused():
    torch.manual_seed(0)
    model = Activations().eval()
    graph_module = fx_graph(model, torch.randn(*SHAPES[0]))
    assert call_targets(graph_module)["Linear"] == 6 and count_calls(graph_module, *ACTIVATIONS) == 5

    result = PrepackLinearWeights().apply(graph_module)

    assert result.modified and result.matched == result.changed == 6
    assert call_targets(graph_module)["Linear"] == 0
    assert _packed(graph_module) == {
        "gelu_module": "gelu", "gelu_tanh": "gelu_tanh", "relu_function": "relu", "two_users": "none", "twice": "none",
    }
    assert count_calls(graph_module, *ACTIVATIONS) == 2, "the GELU after two_users and after twice stay"
    assert "gelu" not in dict(graph_module.named_modules()), "the fused nn.GELU is gone"
    assert any("called at 2 sites" in note for note in result.notes)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)
    assert not PrepackLinearWeights().apply(graph_module).modified


def test_without_fuse_activation_every_activation_stays():
    torch.manual_seed(0)
    model = Activations().eval()
    graph_module = fx_graph(model, torch.randn(*SHAPES[0]))

    PrepackLinearWeights(fuse_activation=False)(graph_module)

    assert set(_packed(graph_module).values()) == {"none"} and count_calls(graph_module, *ACTIVATIONS) == 5
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


def test_layers_that_cannot_be_packed_are_left_alone_with_a_note():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.GELU()).double().eval()
    graph_module = fx_graph(model, torch.randn(2, 8, dtype=torch.float64))

    result = PrepackLinearWeights().apply(graph_module)

    assert not result.modified and result.matched == 1 and result.changed == 0
    assert "float64" in result.notes[0]


def test_a_layer_with_hooks_stays_an_nn_linear():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.GELU()).eval()
    model[0].register_forward_hook(lambda module, args, output: output * 2)
    graph_module = fx_graph(model, torch.randn(2, 8))

    result = PrepackLinearWeights().apply(graph_module)

    assert not result.modified and "hooks" in result.notes[0]
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES))


def test_reverse_restores_linear_layers_and_functional_activations():
    torch.manual_seed(0)
    model = Activations().eval()
    graph_module = fx_graph(model, torch.randn(*SHAPES[0]))
    transformation = PrepackLinearWeights()
    transformation(graph_module)

    result = transformation.apply(graph_module, reverse=True)

    assert result.modified and not _packed(graph_module)
    assert call_targets(graph_module)["Linear"] == 6
    assert graph_module.gelu_module.weight is model.gelu_module.weight, "the same Parameters, nothing copied"
    assert count_calls(graph_module, *ACTIVATIONS) == 5
    assert not transformation.get_transformed_nodes(graph_module)
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=1e-5, rtol=1e-5)


def test_options_and_registration():
    info = registry.get("prepack_linear_weights")
    assert info.frontends == {"fx", "export"} and info.reversible and info.preserves_computation
    assert PrepackLinearWeights().options.batch_size_hint == 128
    with pytest.raises(ValidationError, match="batch_size_hint"):
        PrepackLinearWeights(batch_size_hint=0)
    with pytest.raises(ValidationError, match="extra"):
        PrepackLinearWeights(fuse_gelu=True)


def _bert_graph(model, **trace_options):
    from aot.tracing import symbolic_trace

    graph_module = symbolic_trace(model, input_names=BERT_INPUT_NAMES, **trace_options)
    for cleanup in (MergeLinears(), RemoveDropout(), DeadCodeElimination()):
        cleanup(graph_module)
    return graph_module


def test_bert_numerics_structure_and_the_callers_model_is_untouched():
    model = tiny_bert("sdpa")
    saved = snapshot(model)
    graph_module = _bert_graph(model)
    keys_before = list(graph_module.state_dict())
    assert call_targets(graph_module)["Linear"] == 9 and call_targets(graph_module)[F.gelu] == 2

    result = PrepackLinearWeights().apply(graph_module)

    assert result.changed == 9 and not result.notes
    assert call_targets(graph_module)["Linear"] == 0 and call_targets(graph_module)[F.gelu] == 0
    assert [path for path, activation in _packed(graph_module).items() if activation == "gelu"] == [
        "encoder.layer.0.intermediate.dense", "encoder.layer.1.intermediate.dense",
    ]
    state = graph_module.state_dict()
    assert list(state) == keys_before, "same keys: OneDNNLinear sits at the nn.Linear's path"
    assert all(tensor.layout == torch.strided and not tensor.is_mkldnn for tensor in state.values())
    inputs = [bert_inputs(batch, sequence, seed=index) for index, (batch, sequence) in enumerate(BERT_SHAPES)]
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
    assert all(type(module) is not OneDNNLinear for module in model.modules())
    assert isinstance(model.encoder.layer[0].intermediate.dense, nn.Linear)
    assert_same_tensors(model, saved)


def test_bert_gelu_activation_traced_as_a_leaf_is_fused():
    from transformers.activations import GELUActivation

    model = tiny_bert("sdpa")
    graph_module = _bert_graph(model, leaf_modules=[GELUActivation])
    assert call_targets(graph_module)["GELUActivation"] == 2

    PrepackLinearWeights()(graph_module)

    assert call_targets(graph_module)["GELUActivation"] == 0
    assert sorted(_packed(graph_module).values()).count("gelu") == 2
    assert_matches_eager(model, graph_module, [bert_inputs(2, 7)], atol=1e-5, rtol=1e-4)


# -- ATen graphs (export frontend) ---------------------------------------------------------

_aten = torch.ops.aten


class AtenLayers(nn.Module):
    """A GELU-fused linear, a bias-free one, GPT-2's Conv1D (an addmm on an (in, out) weight), a linear called twice."""

    def __init__(self):
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8, bias=False)
        self.conv1d = Conv1D(12, 8)
        self.twice = nn.Linear(12, 8)

    def forward(self, x):
        h = self.down(F.gelu(self.up(x)))
        return self.twice(self.conv1d(h)) + self.twice(self.conv1d(x))


def test_aten_linears_and_addmms_become_onednn_linears_at_the_paths_holding_their_weights():
    torch.manual_seed(0)
    model = AtenLayers().eval()
    graph_module = export_graph(model, torch.randn(2, 5, 8))
    keys_before = sorted(graph_module.state_dict())
    assert count_calls(graph_module, _aten.linear.default) == 4 and count_calls(graph_module, _aten.addmm.default) == 2

    result = PrepackLinearWeights().apply(graph_module)

    assert result.modified and result.matched == result.changed == 6, result.notes
    assert count_calls(graph_module, _aten.linear.default, _aten.addmm.default, _aten.gelu.default) == 0
    assert _packed(graph_module) == {"up": "gelu", "down": "none", "conv1d": "none", "twice": "none"}
    assert sorted(graph_module.state_dict()) == keys_before, "same keys: each OneDNNLinear holds the weights it replaced"
    assert torch.equal(graph_module.conv1d.weight, model.conv1d.weight.t()), "Conv1D's (in, out) weight is held as (out, in)"
    assert graph_module.up.weight is model.up.weight, "a linear's Parameters are shared, not copied"
    assert_matches_eager(model, graph_module, shape_sets(torch.randn, [(2, 5, 8), (1, 1, 8), (3, 17, 8)]), atol=1e-5, rtol=1e-5)


def test_aten_reverse_gives_back_the_aten_calls_and_the_holders():
    torch.manual_seed(0)
    model = AtenLayers().eval()
    graph_module = export_graph(model, torch.randn(2, 5, 8))
    transformation = PrepackLinearWeights()
    transformation(graph_module)
    assert _packed(graph_module), "precondition: something was packed"

    result = transformation.apply(graph_module, reverse=True)

    assert result.modified and not _packed(graph_module) and not transformation.get_transformed_nodes(graph_module)
    assert count_calls(graph_module, _aten.linear.default) == 4 and count_calls(graph_module, _aten.addmm.default) == 2
    assert count_calls(graph_module, _aten.gelu.default) == 1
    assert torch.equal(graph_module.conv1d.weight, model.conv1d.weight)
    assert_matches_eager(model, graph_module, shape_sets(torch.randn, [(2, 5, 8), (3, 17, 8)]), atol=1e-5, rtol=1e-5)


class ScaledLinear(nn.Module):
    """A weight read by aten.linear from a module that also holds another tensor: not a layer's tensors alone."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return F.linear(x, self.weight) * self.scale


def test_an_aten_weight_whose_module_holds_more_is_left_alone_with_a_note():
    graph_module = export_graph(nn.Sequential(ScaledLinear()).eval(), torch.randn(2, 8))
    assert count_calls(graph_module, _aten.linear.default) == 1

    result = PrepackLinearWeights().apply(graph_module)

    assert not result.modified and result.matched == 1 and result.changed == 0
    assert count_calls(graph_module, _aten.linear.default) == 1
    assert any("holds ['scale', 'weight']" in note for note in result.notes), result.notes


def test_gpt2_conv1d_leaves_on_fx_become_onednn_linears_and_come_back():
    from aot.tracing import symbolic_trace

    torch.manual_seed(0)
    model = AtenLayers().eval()
    example = torch.randn(2, 5, 8)
    graph_module = symbolic_trace(model, input_names=["x"], dummy_inputs={"x": example})
    assert call_targets(graph_module)["Conv1D"] == 2, "precondition: Conv1D is an fx leaf"
    transformation = PrepackLinearWeights()

    result = transformation.apply(graph_module)

    assert result.changed == 6 and call_targets(graph_module)["Conv1D"] == 0
    assert torch.equal(graph_module.conv1d.weight, model.conv1d.weight.t())
    assert_matches_eager(model, graph_module, shape_sets(torch.randn, [(2, 5, 8), (1, 1, 8), (3, 17, 8)]), atol=1e-5, rtol=1e-5)

    transformation.apply(graph_module, reverse=True)

    assert call_targets(graph_module)["Conv1D"] == 2 and torch.equal(graph_module.conv1d.weight, model.conv1d.weight)
    assert_matches_eager(model, graph_module, shape_sets(torch.randn, [(2, 5, 8), (3, 17, 8)]), atol=1e-5, rtol=1e-5)
