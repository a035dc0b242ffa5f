"""quantize_linear_weights with ``method: gptq``: the same grid, codes fitted to the layers' inputs on calibration data."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.errors import PassError
from aot.passes import QuantizeLinearWeights
from aot.passes._gptq import gptq_quantize
from aot.passes._input_hessians import input_hessians
from aot.passes.base import CALIBRATION_KEY
from aot.passes.quantize_linear_weights import HESSIAN_KEY
from aot.runtime import WeightOnlyLinear
from aot.runtime.weight_only_linear import wo_quantize_int4, wo_quantize_int8
from tests.passes.helpers import fx_graph

F = nn.functional
GRIDS = [(4, 32, True, False), (4, 64, False, False), (4, 32, False, True), (8, 0, True, False)]  # (bits, group_size,
# symmetric, float zero points); int8 has one scale per row


class Block(nn.Module):
    """Two MLP blocks and a layer called twice: the second block sees what the first makes of its input."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)
        self.twice = nn.Linear(64, 64)
        self.up_2 = nn.Linear(64, 128)
        self.down_2 = nn.Linear(128, 64, bias=False)

    def forward(self, x):
        h = x + self.down(F.silu(self.up(x)))
        h = self.twice(self.twice(h))
        return h + self.down_2(F.silu(self.up_2(h)))


def _correlated(rows: int, seed: int) -> torch.Tensor:
    """Inputs whose 64 features lie near an 8-dimensional subspace, as a layer's inputs do: H far from diagonal."""
    basis = torch.randn(8, 64, generator=torch.Generator().manual_seed(1234))  # one subspace for every seed
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 8, generator=generator) @ basis + 0.05 * torch.randn(rows, 64, generator=generator)


def _graph_with_calibration(texts: int = 6):
    torch.manual_seed(0)
    graph_module = fx_graph(Block().eval(), torch.randn(1, 5, 64))
    graph_module.meta[CALIBRATION_KEY] = [{"x": _correlated(24, seed)[None]} for seed in range(texts)]
    return graph_module


def _group(bits: int, group_size: int) -> int:
    return group_size if bits == 4 else 64


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("bits, group_size, symmetric, float_zero", GRIDS)
def test_with_uncorrelated_inputs_gptq_is_rounding_to_nearest_code_for_code(bits, group_size, symmetric, float_zero, act_order):
    weight = torch.randn(48, 128)
    nearest = wo_quantize_int4(weight, group_size, symmetric, float_zero) if bits == 4 else wo_quantize_int8(weight)
    hessian = torch.diag(torch.rand(128) + 0.5)  # inputs of different scales, uncorrelated: act-order reorders them
    fitted = gptq_quantize(weight, hessian, bits, _group(bits, group_size), symmetric, act_order=act_order, float_zero=float_zero)
    assert len(fitted) == len(nearest)
    for ours, theirs in zip(fitted, nearest):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("bits, group_size, symmetric, float_zero", GRIDS)
def test_gptq_makes_a_layers_output_error_on_its_inputs_several_times_smaller(bits, group_size, symmetric, float_zero, act_order):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=False)
    rows = _correlated(512, 1)
    calibration, held_out = rows[:256], rows[256:]  # the same subspace; the held-out rows the Hessian did not see
    group = _group(bits, group_size)
    fitted = gptq_quantize(linear.weight, calibration.T @ calibration, bits, group, symmetric, act_order=act_order,
                           float_zero=float_zero)

    def output_error(quantized) -> float:
        layer = WeightOnlyLinear.from_linear(linear, bits, group, symmetric, "float", quantized, "float" if float_zero else "integer")
        return (held_out @ (linear.weight - layer.dequantized_weight()).T).pow(2).mean().item()

    nearest_error, gptq_error = output_error(None), output_error(fitted)
    assert nearest_error > 0, "precondition: rounding moves the outputs"
    assert gptq_error < nearest_error / 3, (gptq_error, nearest_error)


def test_an_input_calibration_never_saw_keeps_weight_zero():
    calibration = _correlated(256, 2)
    calibration[:, 5] = 0
    weight = torch.randn(32, 64)
    codes, scale = gptq_quantize(weight, calibration.T @ calibration, 8, 64, True)
    assert weight[:, 5].abs().min() > 0, "precondition: the weights of the unused input are not 0"
    assert torch.equal(codes[:, 5], torch.zeros(32, dtype=torch.int8))


def test_input_hessians_sum_every_call_and_stop_the_run_once_all_are_seen():
    graph_module = _graph_with_calibration(texts=2)
    ran = []
    graph_module.get_submodule("up_2").register_forward_pre_hook(lambda module, args: ran.append("up_2"))

    hessians = input_hessians(graph_module, {"up": 1, "twice": 2})
    assert ran == [], "a run stops once every layer asked for has seen its calls: up_2 comes after"

    inputs = [sample["x"].reshape(-1, 64) for sample in graph_module.meta[CALIBRATION_KEY]]
    assert set(hessians) == {"up", "twice"}
    torch.testing.assert_close(hessians["up"], sum(rows.T @ rows for rows in inputs))
    seen_by_twice = []
    handle = graph_module.get_submodule("twice").register_forward_pre_hook(lambda module, args: seen_by_twice.append(args[0]))
    for sample in graph_module.meta[CALIBRATION_KEY]:
        graph_module(**sample)
    handle.remove()
    assert len(seen_by_twice) == 4, "precondition: two calls a run"
    torch.testing.assert_close(hessians["twice"], sum(rows.reshape(-1, 64).T @ rows.reshape(-1, 64) for rows in seen_by_twice))


@pytest.mark.parametrize("memory_mib, runs", [(512, 6), (0.01, 30)])
def test_the_pass_calibrates_layers_as_many_at_a_time_as_fit_and_leaves_no_state(memory_mib, runs):
    graph_module = _graph_with_calibration()
    started = []
    graph_module.register_forward_pre_hook(lambda module, args, kwargs: started.append(1), with_kwargs=True)

    result = QuantizeLinearWeights(bits=4, group_size=32, method="gptq", gptq_memory_mib=memory_mib).apply(graph_module)

    assert result.changed == 6 and all(isinstance(graph_module.get_submodule(name), WeightOnlyLinear)
                                       for name in ("up", "down", "twice", "up_2", "down_2"))
    # 6 texts: one run each for all five layers (their H take 0.17 MiB); or one a layer (each H 16 or 64 KiB, over 0.01 MiB)
    assert len(started) == runs
    assert not any(HESSIAN_KEY in node.meta for node in graph_module.graph.nodes)
    assert len(graph_module.meta[CALIBRATION_KEY]) == 6, "the build's inputs are left for it to remove"


def test_the_pass_fits_the_graph_closer_than_rounding_to_nearest():
    outputs = {}
    held_out = _correlated(48, 99)[None]
    for method in ("nearest", "gptq"):
        graph_module = _graph_with_calibration()
        float_output = graph_module(x=held_out)
        QuantizeLinearWeights(bits=4, group_size=32, symmetric=False, activations="float", method=method).apply(graph_module)
        outputs[method] = (graph_module(x=held_out) - float_output).pow(2).mean().item()
    assert outputs["nearest"] > 0, "precondition: int4 moves the output"
    assert outputs["gptq"] < outputs["nearest"] / 2, outputs


def test_gptq_without_calibration_inputs_fails_naming_the_recipe_key():
    torch.manual_seed(0)
    graph_module = fx_graph(Block().eval(), torch.randn(1, 5, 64))
    assert not QuantizeLinearWeights(bits=4).needs_calibration()
    quantize = QuantizeLinearWeights(bits=4, method="gptq")
    assert quantize.needs_calibration()
    with pytest.raises(PassError, match="generation.calibration"):
        quantize.apply(graph_module)
    graph_module.meta[CALIBRATION_KEY] = []
    with pytest.raises(PassError, match="generation.calibration"):
        quantize.apply(graph_module)
    assert not any(isinstance(module, WeightOnlyLinear) for module in graph_module.modules())


def test_act_order_rounds_in_another_order_on_the_same_grid():
    rows = _correlated(256, 3) * torch.linspace(0.2, 3, 64)  # inputs of unequal energy: diag H is not in column order
    hessian, weight = rows.T @ rows, torch.randn(32, 64)
    in_order = gptq_quantize(weight, hessian.clone(), 4, 32, False, act_order=False)  # gptq_quantize uses H up
    by_energy = gptq_quantize(weight, hessian.clone(), 4, 32, False, act_order=True)
    static = wo_quantize_int4(weight, 32, False)
    assert not torch.equal(in_order[0], by_energy[0]), "the codes differ"
    assert torch.equal(by_energy[1], static[1]) and torch.equal(by_energy[2], static[2]), "static groups: the grid before any column moves"


@pytest.mark.parametrize("bits", [4, 8])
def test_rows_rounded_a_block_at_a_time_are_the_whole_weights_result(monkeypatch, bits):
    from aot.passes import _gptq

    rows = _correlated(256, 4)
    hessian, weight = rows.T @ rows, torch.randn(80, 64)
    whole = gptq_quantize(weight, hessian.clone(), bits, 32, True, act_order=True)
    monkeypatch.setattr(_gptq, "ROWS_PER_BLOCK", 16)
    assert weight.shape[0] > _gptq.ROWS_PER_BLOCK, "precondition: several blocks"
    for blocked, at_once in zip(gptq_quantize(weight, hessian, bits, 32, True, act_order=True), whole):
        assert torch.equal(blocked, at_once)
