"""The tracer's promises: no mutation, no hidden specialisation, no baked dtype, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch

from aot.errors import TraceError
from aot.tracing import symbolic_trace
from aot.tracing.outputs import flatten_outputs
from tests.tracing.tracing_zoo import ZOO, _text_inputs, assert_matches_eager


def _model_state(model):
    return {
        "tensors": {name: value.clone() for name, value in model.state_dict(keep_vars=False).items()},
        "attributes": {name: sorted(module.__dict__) for name, module in model.named_modules()},
        "hooks": {name: (len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()},
        "config": model.config.to_dict(),
    }


@pytest.mark.artifact
@pytest.mark.parametrize("name", ["bert", "llama", "t5"])
def test_eager_model_is_never_mutated(name):
    model, names, make_inputs = ZOO[name]("sdpa")
    model.config.output_hidden_states = True  # makes transformers install output-capturing hooks on first use
    inputs = make_inputs[0]()
    before_state = _model_state(model)
    with torch.no_grad():
        before = flatten_outputs(model(**inputs))
    before_state = _model_state(model)  # after the first call installed its hooks

    if name != "t5":  # T5Model returns no hidden states for the config flag
        assert "hidden_states.0" in before
    gm = symbolic_trace(model, names)
    assert list(flatten_outputs(gm(**inputs))) == list(before)
    gm.to(torch.bfloat16)  # converting or editing the GraphModule must not reach the model either
    for parameter in gm.parameters():
        parameter.data.mul_(0)

    after_state = _model_state(model)
    assert after_state["attributes"] == before_state["attributes"]
    assert after_state["hooks"] == before_state["hooks"]
    assert after_state["config"] == before_state["config"]
    for key, value in before_state["tensors"].items():
        assert torch.equal(after_state["tensors"][key], value), key
    with torch.no_grad():
        after = flatten_outputs(model(**inputs))
    assert list(after) == list(before)
    assert all(torch.equal(after[key], before[key]) for key in before)


def test_attribute_left_holding_a_proxy_is_restored():
    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.last = None

        def forward(self, x):
            self.last = self.linear(x)
            self.seen = True
            return self.last * 2

    model = Caching()
    gm = symbolic_trace(model, ["x"], dummy_inputs={"x": torch.randn(2, 4)})
    assert model.last is None and not hasattr(model, "seen")
    assert sorted(gm.meta["trace_report"]["restored_attributes"]) == ["last", "seen (added during tracing)"]


@pytest.mark.artifact
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "mistral"])
def test_no_hidden_specialisation(name, attn):
    model, names, _ = ZOO[name](attn)
    gm = symbolic_trace(model, names, dummy_inputs=_text_inputs(names, 2, 16))
    shapes = [(1, 1), (1, 3), (4, 40), (5, 16), (2, 17)]  # mistral's sliding window is 8
    assert_matches_eager(model, gm, [lambda b=b, s=s: _text_inputs(names, b, s) for b, s in shapes])


def test_decisions_on_traced_values_are_recorded():
    model, names, _ = ZOO["llama"]("sdpa")
    report = symbolic_trace(model, names).meta["trace_report"]
    by_expression = {d["expression"]: d for d in report["decisions"]}
    decision = next(d for e, d in by_expression.items() if "q_length == 1" in e)
    assert decision["value"] is False and decision["count"] == 2 and decision["file"].endswith("sdpa_attention.py")


@pytest.mark.artifact
@pytest.mark.parametrize("name", ["bert", "llama", "gpt2", "t5"])
def test_dtype_is_not_baked(name):
    model, names, make_inputs = ZOO[name]("eager")
    gm = symbolic_trace(model, names)
    assert gm.meta["trace_report"]["baked_constants"] == []
    reference = copy.deepcopy(model).to(torch.bfloat16)
    gm = gm.to(torch.bfloat16)
    inputs = make_inputs[1]()
    with torch.no_grad():
        expected, actual = flatten_outputs(reference(**inputs)), flatten_outputs(gm(**inputs))
    for key, value in expected.items():
        assert actual[key].dtype == torch.bfloat16
        torch.testing.assert_close(actual[key], value, atol=1e-2, rtol=1e-2)


def test_baked_constants_are_reported():
    class Offset(torch.nn.Module):
        def forward(self, x):
            return x + torch.ones(3)  # a constant the model itself hard-codes

    gm = symbolic_trace(Offset(), ["x"], dummy_inputs={"x": torch.zeros(2, 3)})
    (constant,) = gm.meta["trace_report"]["baked_constants"]
    assert constant["shape"] == [3] and constant["dtype"] == "torch.float32"
    assert constant["file"].endswith("test_trace_requirements.py") and "torch.ones(3)" in constant["expression"]


class _Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


class _GatedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.gate = _Gate()

    def forward(self, x):
        return self.gate(self.linear(x))


def test_data_dependent_control_flow_names_the_line_and_the_fixes():
    with pytest.raises(TraceError) as caught:
        symbolic_trace(_GatedModel(), ["x"], dummy_inputs={"x": torch.randn(2, 4)})
    message = str(caught.value)
    assert "\n" not in message
    assert "test_trace_requirements.py" in message and "if x.sum() > 0:" in message
    line = _Gate.forward.__code__.co_firstlineno + 1
    assert f":{line} " in message
    assert "leaf_modules" in message and "autowrap_functions" in message and "export" in message
    assert "module 'gate'" in message


def test_an_output_size_that_depends_on_data_traces_and_follows_the_data():
    class NonzeroAndUnique(torch.nn.Module):
        def forward(self, x):
            return x.nonzero(), torch.unique_consecutive(x.round())

    model = NonzeroAndUnique()
    gm = symbolic_trace(model, ["x"], dummy_inputs={"x": torch.tensor([0.0, 1.0, 2.0])})
    targets = {node.target for node in gm.graph.nodes}
    assert "nonzero" in targets and torch.functional.unique_consecutive in targets
    for x in (torch.tensor([0.0, 0.0, 3.0, 3.0, 3.0, 0.0, 5.0]), torch.tensor([1.0]), torch.zeros(4)):
        expected = model(x)
        assert expected[0].shape[0] != 2 or expected[1].shape[0] != 3, "precondition: not the traced sizes"
        for actual, wanted in zip(gm(x=x), expected):
            torch.testing.assert_close(actual, wanted)


def test_a_decision_on_a_size_that_depends_on_data_names_the_line():
    class Branch(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.nonzero().shape[0] > 1 else x

    with pytest.raises(TraceError, match=r"data-dependent control flow at .*test_trace_requirements.py:\d+ `return x \* 2 if x.nonzero"):
        symbolic_trace(Branch(), ["x"], dummy_inputs={"x": torch.randn(3)})


def test_a_torch_function_called_by_the_model_is_reported_at_the_model_line():
    class Contract(torch.nn.Module):
        def forward(self, x, dims):
            return torch.tensordot(x, x, dims=dims)  # a function of torch/functional.py: its caller is where to act

    assert torch.tensordot.__module__ == "torch.functional", "precondition: the op's own frame is torch's"
    inputs = {"x": torch.randn(3, 3), "dims": torch.tensor(1)}
    with pytest.raises(TraceError, match=r"data-dependent operation at .*test_trace_requirements.py:\d+ `return torch.tensordot\(x, x, dims=dims\)"):
        symbolic_trace(Contract(), list(inputs), dummy_inputs=inputs)


def test_a_leaf_module_fixes_data_dependent_control_flow():
    model = _GatedModel()
    gm = symbolic_trace(model, ["x"], dummy_inputs={"x": torch.randn(2, 4)}, leaf_modules=["gate"])
    for x in (torch.randn(3, 4), -torch.ones(1, 4) * 100):
        torch.testing.assert_close(gm(x=x), model(x))


def test_without_example_values_control_flow_is_an_aot_trace_error():
    class Shape(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] > 1 else x

    with pytest.raises(TraceError, match="pass dummy_inputs"):
        symbolic_trace(Shape())
    gm = symbolic_trace(Shape(), dummy_inputs={"x": torch.ones(2, 3)})
    assert gm.meta["trace_report"]["decisions"][0]["expression"] == "return x * 2 if x.shape[0] > 1 else x"
