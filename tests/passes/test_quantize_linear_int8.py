"""QuantizeLinearInt8: which layers turn int8, the weight and activation maths, the kernel against the formula, BERT."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from aot.passes import MergeLinears, QuantizeLinearInt8, registry
from aot.runtime import Int8DynamicLinear
from aot.runtime.int8_linear import (
    _int8_fake_quantized_activation,
    _int8_per_token_activation,
    _int8_vnni,
    int8_quantize_weight,
)
from tests.passes.helpers import BERT_INPUT_NAMES, BERT_SHAPES, bert_inputs, call_targets, fx_graph, tiny_bert

F = nn.functional


class Layers(nn.Module):
    """A plain linear, one without bias, one called twice, a classifier to skip, and a float64 one."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 24)
        self.no_bias = nn.Linear(24, 24, bias=False)
        self.twice = nn.Linear(24, 24)
        self.classifier = nn.Linear(24, 3)
        self.wide = nn.Linear(3, 3).double()

    def forward(self, x):
        h = F.gelu(self.dense(x))
        h = self.twice(self.twice(self.no_bias(h)))
        logits = self.classifier(h)
        return logits, self.wide(logits.double())


def _int8_layers(graph_module) -> dict[str, Int8DynamicLinear]:
    return {name: module for name, module in graph_module.named_modules() if isinstance(module, Int8DynamicLinear)}


def test_the_pass_is_registered_as_changing_the_computation():
    info = registry.get("quantize_linear_int8")
    assert info.cls is QuantizeLinearInt8
    assert not info.preserves_computation and info.supports("fx") and not info.supports("export")


def test_float32_linears_become_int8_and_skipped_or_float64_ones_are_noted():
    torch.manual_seed(0)
    graph_module = fx_graph(Layers().eval(), torch.randn(2, 16))
    assert call_targets(graph_module)["Linear"] == 6, "precondition: five layers, one called twice"

    quantize = QuantizeLinearInt8(skip=["classifier"])
    result = quantize.apply(graph_module)

    assert set(_int8_layers(graph_module)) == {"dense", "no_bias", "twice"}
    assert result.changed == 4 and result.matched == 6, "the layer called twice counts both sites"
    assert type(graph_module.get_submodule("classifier")) is nn.Linear
    assert any("'classifier'" in note and "skip pattern 'classifier'" in note for note in result.notes), result.notes
    assert any("'wide'" in note and "torch.float64" in note for note in result.notes), result.notes
    transformed = [node.name for node in quantize.get_transformed_nodes(graph_module)]
    assert sorted(transformed) == ["dense", "no_bias", "twice", "twice_1"]


def test_weights_are_symmetric_int8_per_channel_within_half_a_step():
    torch.manual_seed(0)
    weight = torch.randn(24, 16) * torch.linspace(0.01, 2.0, 24)[:, None]  # channels of very different ranges
    quantized, scale = int8_quantize_weight(weight)
    assert quantized.dtype == torch.int8 and scale.shape == (24,) and scale.dtype == torch.float32
    assert quantized.abs().max() == 127 and quantized.min() >= -127
    error = (quantized.float() * scale[:, None] - weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-7).all()

    per_tensor_q, per_tensor_scale = int8_quantize_weight(weight, per_channel=False)
    assert torch.unique(per_tensor_scale).numel() == 1
    per_tensor_error = (per_tensor_q.float() * per_tensor_scale[:, None] - weight).abs()
    assert per_tensor_error[0].max() > 10 * error[0].max(), "a small channel loses its resolution with one scale"


def test_activations_round_to_a_uint8_grid_that_holds_zero():
    x = torch.tensor([[-1.0, 0.0, 0.5, 3.0]])
    rounded = _int8_fake_quantized_activation(x)
    step = 4.0 / 255
    assert rounded[0, 1] == 0, "zero is exact, so padding and ReLU zeros stay zero"
    assert ((rounded - x).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(_int8_fake_quantized_activation(torch.zeros(3)), torch.zeros(3)), "an all-zero input has no range"
    positive = torch.tensor([2.0, 4.0])
    assert torch.allclose(_int8_fake_quantized_activation(positive), positive, atol=4.0 / 255 / 2)


def test_per_token_activations_round_each_row_to_its_own_symmetric_grid():
    x = torch.tensor([[0.01, -0.02, 0.005], [50.0, -1.0, 0.0]])
    rounded = _int8_per_token_activation(x)
    steps = torch.tensor([[0.02 / 127], [50.0 / 127]])
    assert ((rounded - x).abs() <= steps / 2 + 1e-9).all()
    per_tensor_error = (_int8_fake_quantized_activation(x) - x).abs()[0].max()
    assert per_tensor_error > 100 * (rounded - x).abs()[0].max(), "the small row keeps its resolution beside the large one"


FORMULAS = {"per_tensor": _int8_fake_quantized_activation, "per_token": _int8_per_token_activation}


@pytest.mark.parametrize(("activations", "engine"), [("per_tensor", "onednn"), ("per_tensor", "fbgemm"), ("per_token", "onednn")])
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16), (1, 1, 16)])
def test_the_int8_kernel_computes_the_documented_formula(activations, engine, shape):
    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    layer = Int8DynamicLinear.from_linear(linear, activations=activations, engine=engine).eval()
    x = torch.randn(*shape) * 3
    if activations == "per_tensor" and not _int8_vnni():
        pytest.skip("per_tensor's uint8 x int8 kernels saturate on this CPU (no VNNI): the formula runs instead (tested below)")
    assert layer._use_kernel(x), "precondition: the int8 GEMM runs on this CPU"
    with torch.no_grad():
        kernel = layer(x)
        formula = F.linear(FORMULAS[activations](x), layer.dequantized_weight(), layer.bias)
        exact = linear(x)
    torch.testing.assert_close(kernel, formula, rtol=1e-4, atol=1e-4)
    assert (kernel - exact).abs().max() > 1e-4, "the int8 layer does round: this is not the float layer"
    assert F.cosine_similarity(kernel.flatten(), exact.flatten(), dim=0) > 0.999


def _saturating_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """A row whose uint8 codes are all 255 times int8 weights all 127: every neighbouring pair of products (64,770)
    overflows an int16 (32,767), where VNNI's int32 sums hold it."""
    x = torch.full((4, 64), 2.0)
    x[:, 0] = -0.01  # the range holds zero: zero point 1, every other code 255
    weight = torch.full((8, 64), 0.5)
    return x, weight


@pytest.mark.parametrize("engine", ["onednn", "fbgemm"])
def test_the_per_tensor_kernel_runs_only_where_its_sums_are_exact(engine):
    x, weight = _saturating_pairs()
    linear = nn.Linear(64, 8, bias=False)
    linear.weight.data.copy_(weight)
    layer = Int8DynamicLinear.from_linear(linear, activations="per_tensor", engine=engine).eval()
    assert engine in torch.backends.quantized.supported_engines, "precondition: the engine is built into this torch"
    with torch.no_grad():
        formula = F.linear(_int8_fake_quantized_activation(x), layer.dequantized_weight())
        kernel = torch.ops.quantized.linear_dynamic(x, layer.packed_params(), False)
        assert layer._use_kernel(x) == _int8_vnni()
        if _int8_vnni():
            torch.testing.assert_close(kernel, formula, rtol=1e-4, atol=1e-4)
        else:  # the reason the kernel is not used here: it saturates
            assert (kernel - formula).abs().max() > 1.0, "a CPU without VNNI whose kernel does not saturate: the check is wrong"
        torch.testing.assert_close(layer(x), formula, rtol=1e-4, atol=1e-4)


def test_the_formula_runs_where_the_kernel_does_not():
    torch.manual_seed(0)
    layer = Int8DynamicLinear.from_linear(nn.Linear(16, 8)).eval()
    x = torch.randn(3, 16)
    assert not layer._use_kernel(x.double()) and not layer._use_kernel(x.requires_grad_())
    with torch.no_grad():
        torch.testing.assert_close(layer(x.double()).float(), layer(x.detach()), rtol=1e-4, atol=1e-4)


def test_the_prepacked_weight_is_derived_state():
    torch.manual_seed(0)
    layer = Int8DynamicLinear.from_linear(nn.Linear(16, 8)).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = layer(x)
        layer.packed_params()  # what a call packs where the kernel runs (a CPU without VNNI runs the formula)
    assert layer._packed is not None, "precondition: the weight is packed"
    assert set(layer.state_dict()) == {"weight", "weight_scale", "bias"}
    assert copy.deepcopy(layer)._packed is None and pickle.loads(pickle.dumps(layer))._packed is None

    state = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    state["weight"] = -state["weight"]
    layer.load_state_dict(state)
    assert layer._packed is None, "a new weight drops the packed one"
    with torch.no_grad():
        torch.testing.assert_close(layer(x), -before + 2 * layer.bias, rtol=1e-4, atol=1e-4)


def test_an_int8_layer_keeps_its_prepacked_weight_through_a_move_that_changes_nothing():
    torch.manual_seed(0)
    layer = Int8DynamicLinear.from_linear(nn.Linear(16, 8)).eval()
    packed = layer.packed_params()
    assert layer._packed is not None, "precondition: prepacked"
    assert layer.to("cpu").float()._packed[1] is packed
    layer.double()
    assert layer._packed is None, "the bias converted: its prepacked copy goes"


@pytest.mark.parametrize("activations", ["per_tensor", "per_token"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_bert_in_int8_stays_close_to_eager_at_several_shapes(attn_implementation, activations):
    from aot.tracing.outputs import flatten_outputs
    from aot.tracing import symbolic_trace

    model = tiny_bert(attn_implementation)
    graph_module = MergeLinears()(symbolic_trace(model, input_names=BERT_INPUT_NAMES))
    QuantizeLinearInt8(skip=["pooler.*"], activations=activations)(graph_module)
    assert len(_int8_layers(graph_module)) == 2 * 4, "precondition: q/k/v merged, then four linears a layer"
    for batch, sequence in BERT_SHAPES:
        inputs = bert_inputs(batch, sequence)
        with torch.no_grad():
            want, got = flatten_outputs(model(**inputs)), flatten_outputs(graph_module(**inputs))
        hidden_want, hidden_got = want["last_hidden_state"], got["last_hidden_state"]
        assert not torch.equal(hidden_want, hidden_got)
        cosine = F.cosine_similarity(hidden_got.flatten(0, 1), hidden_want.flatten(0, 1), dim=-1)
        assert cosine.min() > 0.999, (batch, sequence, cosine.min())


def test_options_are_typed():
    with pytest.raises(ValidationError):
        QuantizeLinearInt8(engine="qnnpack")
    with pytest.raises(ValidationError):
        QuantizeLinearInt8(activations="per_row")
    with pytest.raises(ValidationError):
        QuantizeLinearInt8(skip=["classifier"], unknown=1)


@pytest.mark.parametrize("activations", ["per_tensor", "per_token"])
def test_one_dimensional_and_empty_inputs_run_like_a_linear_layer(activations):
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    layer = Int8DynamicLinear.from_linear(linear, activations=activations).eval()
    with torch.no_grad():
        vector = torch.randn(16)
        assert layer(vector).shape == (8,)
        torch.testing.assert_close(layer(vector), layer(vector[None])[0])
        empty = torch.randn(0, 5, 16)
        assert layer(empty).shape == (0, 5, 8) == linear(empty).shape


def test_layers_packed_from_several_threads_leave_the_quantized_engine_as_it_was():
    import threading

    before = torch.backends.quantized.engine
    assert {"onednn", "fbgemm"} <= set(torch.backends.quantized.supported_engines), "precondition: both engines here"
    torch.manual_seed(0)
    layers = [Int8DynamicLinear.from_linear(nn.Linear(64, 64), engine=engine) for engine in ("onednn", "fbgemm") * 8]
    threads = [threading.Thread(target=layer.packed_params) for layer in layers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.backends.quantized.engine == before
    x = torch.randn(4, 64)
    with torch.no_grad():
        for layer in layers:  # each packed for its own engine: the kernel still computes the formula
            torch.testing.assert_close(layer(x), F.linear(_int8_fake_quantized_activation(x), layer.dequantized_weight(), layer.bias),
                                       rtol=1e-4, atol=1e-4)
