"""A traced GraphModule holding a parametrized leaf (weight_norm's convolution, as in wav2vec2) pickles, torch.saves and
deep-copies, and computes what the model does from the same parameters, while the model's own module still refuses."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch.nn.utils import parametrize

from aot.tracing import symbolic_trace
from aot.tracing.outputs import flatten_outputs
from tests.export.models import WeightNormConv


class Halved(torch.nn.Module):
    def forward(self, weight):
        return weight / 2


class ChainedParametrizations(torch.nn.Module):
    """A weight under two parametrizations of one original tensor (a chain), beside weight_norm's two originals."""

    def __init__(self):
        super().__init__()
        chained = torch.nn.Linear(6, 4)
        parametrize.register_parametrization(chained, "weight", torch.nn.Tanh())
        parametrize.register_parametrization(chained, "weight", Halved())
        self.chained = chained
        self.normed = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 4))

    def forward(self, x):
        return self.normed(x) + self.chained(x)


def _round_trips(graph_module):
    yield "pickle", pickle.loads(pickle.dumps(graph_module))
    buffer = io.BytesIO()
    torch.save(graph_module, buffer)
    buffer.seek(0)
    yield "torch.save", torch.load(buffer, weights_only=False)
    yield "deepcopy then pickle", pickle.loads(pickle.dumps(copy.deepcopy(graph_module)))


@pytest.mark.parametrize("model_class, shape", [(WeightNormConv, (3, 8, 13)), (ChainedParametrizations, (5, 6))])
def test_a_graph_with_a_parametrized_leaf_pickles_and_computes_what_the_model_does(model_class, shape):
    torch.manual_seed(0)
    model = model_class().eval()
    with pytest.raises(RuntimeError, match="only supported through state_dict"):
        pickle.dumps(model)  # precondition: torch refuses the model's parametrized module
    traced = symbolic_trace(model, input_names=["x"], dummy_inputs={"x": torch.randn(*shape)})
    leaves = [node.target for node in traced.graph.nodes if node.op == "call_module"]
    assert leaves and all(parametrize.is_parametrized(traced.get_submodule(target)) for target in leaves), "precondition: leaves"
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x)
    for how, loaded in _round_trips(traced):
        assert loaded.state_dict().keys() == model.state_dict().keys(), how
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), (how, name)  # g and v as they were, not derived anew
        for target in leaves:
            module = loaded.get_submodule(target)
            assert parametrize.is_parametrized(module) and type(module).__bases__ == (type(model.get_submodule(target)).__bases__), how
        with torch.no_grad():
            torch.testing.assert_close(flatten_outputs(loaded(x=x))["output"], expected, rtol=0, atol=0, msg=how)
    with pytest.raises(RuntimeError, match="only supported through state_dict"):
        pickle.dumps(model)  # the model's own class is untouched
