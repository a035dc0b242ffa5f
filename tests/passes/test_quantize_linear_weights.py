"""QuantizeLinearWeights: which layers turn int4/int8, the codes' maths, the CPU kernels against the formula."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from aot.passes import QuantizeLinearWeights, registry
from aot.runtime import WeightOnlyLinear, weight_only_linear
from aot.runtime.weight_only_linear import wo_pack_int4, wo_quantize_int4, wo_quantize_int8, wo_unpack_int4
from tests.passes.helpers import call_targets, fx_graph

F = nn.functional


class Decoder(nn.Module):
    """An MLP block, a layer called twice, an output projection named lm_head, a width no group divides, a float64 one."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)
        self.twice = nn.Linear(64, 64)
        self.odd = nn.Linear(64, 48)
        self.lm_head = nn.Linear(48, 96, bias=False)
        self.wide = nn.Linear(96, 8).double()

    def forward(self, x):
        h = self.twice(self.twice(self.down(F.silu(self.up(x)))))
        logits = self.lm_head(self.odd(h))
        return logits, self.wide(logits.double())


def _quantized(graph_module) -> dict[str, WeightOnlyLinear]:
    return {name: module for name, module in graph_module.named_modules() if isinstance(module, WeightOnlyLinear)}


def test_the_pass_is_registered_as_changing_the_computation():
    info = registry.get("quantize_linear_weights")
    assert info.cls is QuantizeLinearWeights
    assert not info.preserves_computation and info.supports("fx")


def test_float32_linears_become_weight_only_and_the_rest_are_noted():
    torch.manual_seed(0)
    graph_module = fx_graph(Decoder().eval(), torch.randn(2, 64))
    assert call_targets(graph_module)["Linear"] == 7, "precondition: six layers, one called twice"

    quantize = QuantizeLinearWeights(bits=4, group_size=64)
    result = quantize.apply(graph_module)

    assert set(_quantized(graph_module)) == {"up", "down", "twice", "odd"}
    assert result.changed == 5 and result.matched == 7, "the layer called twice counts both sites"
    assert any("'lm_head'" in note and "48 input features are no whole number of groups of 64" in note for note in result.notes), result.notes
    assert any("'wide'" in note and "torch.float64" in note for note in result.notes), result.notes
    assert sorted(node.name for node in quantize.get_transformed_nodes(graph_module)) == ["down", "odd", "twice", "twice_1", "up"]


def test_skip_patterns_and_lm_head_keep_layers_in_float():
    torch.manual_seed(0)
    graph_module = fx_graph(Decoder().eval(), torch.randn(2, 64))
    result = QuantizeLinearWeights(bits=8, lm_head=False, skip=["tw*"]).apply(graph_module)
    assert set(_quantized(graph_module)) == {"up", "down", "odd"}
    assert any("'lm_head'" in note and "lm_head: false" in note for note in result.notes), result.notes
    assert any("'twice'" in note and "skip pattern 'tw*'" in note for note in result.notes), result.notes


def test_options_are_typed():
    with pytest.raises(ValidationError):
        QuantizeLinearWeights(bits=3)
    with pytest.raises(ValidationError):
        QuantizeLinearWeights(group_size=48)
    assert QuantizeLinearWeights(symmetric=False, zero_point="float").options.zero_point == "float"
    for symmetric_or_int8 in ({}, {"bits": 8, "symmetric": False}):  # float zero points are for asymmetric int4 only
        with pytest.raises(ValidationError, match="zero_point: float is for asymmetric int4"):
            QuantizeLinearWeights(zero_point="float", **symmetric_or_int8)


GRIDS = {"symmetric": (True, False), "integer zero points": (False, False), "float zero points": (False, True)}


@pytest.mark.parametrize("symmetric,float_zero", GRIDS.values(), ids=GRIDS)
@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_codes_are_within_half_a_step_of_each_group(symmetric, float_zero, group_size):
    torch.manual_seed(0)
    weight = torch.randn(24, 256) * torch.linspace(0.01, 2.0, 24)[:, None] + (0.0 if symmetric else 0.3)
    packed, scale, zero = wo_quantize_int4(weight, group_size, symmetric, float_zero)
    assert zero.dtype == (torch.float32 if float_zero else torch.uint8)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 128) and scale.shape == (24, 256 // group_size)
    codes = wo_unpack_int4(packed)
    assert torch.equal(wo_pack_int4(codes), packed) and int(codes.max()) <= 15
    if symmetric:
        assert torch.equal(zero, torch.full_like(zero, 8)) and int(codes.min()) >= 1, "symmetric codes span -7..7 around 8"
    dequantized = ((codes.float().reshape(24, -1, group_size) - zero.float()[..., None]) * scale[..., None]).reshape(24, 256)
    assert ((dequantized - weight).abs() <= scale.repeat_interleave(group_size, dim=1) / 2 + 1e-6).all()
    if float_zero:  # the grid spans each group's range exactly: its least and greatest weights are codes 0 and 15
        groups = weight.reshape(24, -1, group_size)
        torch.testing.assert_close(dequantized.reshape(24, -1, group_size).amin(-1), groups.amin(-1), rtol=0, atol=1e-6)
        torch.testing.assert_close(dequantized.reshape(24, -1, group_size).amax(-1), groups.amax(-1), rtol=0, atol=1e-5)


def test_float_zero_points_keep_weights_already_on_a_q4_1_grid_and_integer_ones_do_not():
    """Weights rounded once to llama.cpp's Q4_1 (per group of 32, ``min + q · d``, codes 0 and 15 used) come back to
    float32's rounding of the scales with float zero points; integer zero points, whose grid holds 0, move them."""
    torch.manual_seed(0)
    low, step = torch.randn(40, 8, 1) * 0.2, torch.rand(40, 8, 1) * 0.02 + 0.001
    codes = torch.randint(0, 16, (40, 8, 32)).float()
    codes[..., 0], codes[..., 1] = 0, 15
    weight = (low + codes * step).reshape(40, 256)
    errors = {}
    for float_zero in (True, False):
        packed, scale, zero = wo_quantize_int4(weight, 32, False, float_zero)
        back = (wo_unpack_int4(packed).float().reshape(40, 8, 32) - zero.float()[..., None]) * scale[..., None]
        errors[float_zero] = (back.reshape(40, 256) - weight).abs().max().item()
    assert errors[True] < 1e-6 < 1e-3 < errors[False], errors

def test_int8_codes_are_per_channel_within_half_a_step():
    torch.manual_seed(0)
    weight = torch.randn(24, 64) * torch.linspace(0.01, 2.0, 24)[:, None]
    quantized, scale = wo_quantize_int8(weight)
    assert quantized.dtype == torch.int8 and quantized.abs().max() == 127 and scale.shape == (24,)
    assert ((quantized.float() * scale[:, None] - weight).abs() <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("bits,group_size,symmetric,zero_point",
                         [(4, 32, True, "integer"), (4, 64, False, "integer"), (4, 64, False, "float"), (4, 256, True, "integer"),
                          (8, 32, True, "integer")])
@pytest.mark.parametrize("rows,dot_products", [(1, True), (7, True), (130, True), (130, False)])
def test_int8_activations_run_int8_gemms_on_codes_within_half_a_step(bits, group_size, symmetric, zero_point, rows, dot_products,
                                                                     monkeypatch):
    """Any int8 layer's call on a CPU with int8 dot products, and more rows than the weight-only kernels take on one
    without (90 output rows: no whole int4 tiles, so the int4 layers never take theirs)."""
    monkeypatch.setattr(weight_only_linear, "_wo_vnni", lambda: dot_products)
    torch.manual_seed(0)
    linear = nn.Linear(256, 90)
    layer = WeightOnlyLinear.from_linear(linear, bits, group_size, symmetric, zero_point=zero_point)
    x = torch.randn(rows, 256)
    assert layer.activations == "int8" and layer._use_kernel(x), "precondition: float32 on the CPU runs torch._int_mm"
    assert not layer._weight_only_kernel_fits(x), "precondition: no weight-only kernel takes the call"
    with torch.no_grad():
        output = layer(x)
        codes, scale = layer.derived_weight()
    assert codes.dtype == torch.int8 and scale.shape == (90,)
    regridded, exact = codes.float() * scale[:, None], layer.dequantized_weight()
    assert ((regridded - exact).abs() <= scale[:, None] / 2 + 1e-7).all(), "the int8 grid moves a weight by half its step at most"
    if bits == 4:
        assert (scale[:, None] <= layer.weight_scale.max(dim=1, keepdim=True).values * 8 / 127 + 1e-7).all(), "under a 1/16 int4 step"
    torch.testing.assert_close(output, F.linear(_int8_rows_but_outliers(x), regridded, linear.bias), atol=1e-4, rtol=1e-5)


def _int8_rows_but_outliers(x: torch.Tensor) -> torch.Tensor:
    """What the int8 GEMMs compute with: each row's 8 largest |x| on the row's int8 grid, the rest on a grid of their own."""
    outliers = torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.abs().topk(weight_only_linear._WO_OUTLIERS_PER_ROW, dim=1).indices, True)
    return _on_int8_grid(x.masked_fill(outliers, 0)) + _on_int8_grid(x * outliers)


def _on_int8_grid(x: torch.Tensor) -> torch.Tensor:
    step = x.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(x / step) * step


def test_a_rows_few_large_activations_take_an_int8_grid_of_their_own_and_leave_the_rest_a_fine_one():
    """A decoder's hidden states carry a few channels tens of times larger than the rest: rounded with the rest in one
    per-row scale they would leave the rest a few int8 levels; on a grid of their own, the rest round on a finer one,
    and a row's result does not depend on the rows beside it in the call."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False)
    layer = WeightOnlyLinear.from_linear(linear, bits=8)
    x = torch.randn(40, 256)
    x[:, [3, 17, 40, 77, 120, 160, 200, 250]] *= 60  # outlier channels, as in a real decoder's activations
    with torch.no_grad():
        output, alone = layer(x), layer(x[:12])
        exact = F.linear(x, layer.dequantized_weight())
        largest = x.abs().amax(dim=1, keepdim=True)
        per_row = F.linear(torch.round(x * (127 / largest)) * (largest / 127), layer.dequantized_weight())
    assert (per_row - exact).abs().mean() > exact.abs().mean() / 100, "precondition: a per-row int8 scale loses the small channels"
    # what remains is mostly the outliers' own rounding (their grid's step is the per-row one)
    assert (output - exact).abs().mean() < (per_row - exact).abs().mean() / 4
    torch.testing.assert_close(alone, output[:12], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bits", [4, 8])
def test_outliers_stacked_under_the_gemm_and_multiplied_by_their_columns_give_the_same_bits(bits, monkeypatch):
    """A decode step on a CPU with int8 dot products stacks each row's outliers as a row of their own under the int8
    GEMM; otherwise they are multiplied with the weight's columns they meet: both sum the same integers exactly."""
    monkeypatch.setattr(weight_only_linear, "_wo_vnni", lambda: True)  # stacking where the CPU would not choose it
    torch.manual_seed(0)
    layer = WeightOnlyLinear.from_linear(nn.Linear(256, 48), bits=bits, group_size=32)
    codes, _ = layer.derived_weight()
    x = torch.randn(weight_only_linear._WO_STACKED_ROWS + 5, 256)
    x[:, [9, 100]] *= 40
    with torch.no_grad():
        gathered = layer._int8_product(x, codes)
        stacked = torch.cat([layer._int8_product(x[start:start + 4], codes) for start in range(0, len(x), 4)])
    assert len(x) > weight_only_linear._WO_STACKED_ROWS >= 4, "precondition: one call of each way"
    assert torch.equal(stacked, gathered)


@pytest.mark.parametrize("group_size,symmetric,zero_point", [(32, True, "integer"), (64, False, "integer"), (256, False, "integer"),
                                                          (32, False, "float")])
@pytest.mark.parametrize("rows", [1, 8])
def test_a_decode_steps_few_rows_run_torchs_int4_kernel_on_the_int4_codes(group_size, symmetric, zero_point, rows):
    """bfloat16 activations, scales and offsets: within bfloat16's rounding (2^-8 of the output) of the codes' float
    formula; an offset of the wrong sign would move the asymmetric layers' outputs by whole int4 steps."""
    torch.manual_seed(0)
    linear = nn.Linear(512, 96)
    with torch.no_grad():
        linear.weight.add_(0.03)  # off-centre weights: asymmetric zero points differ from 8
    layer = WeightOnlyLinear.from_linear(linear, 4, group_size, symmetric, zero_point=zero_point)
    x = torch.randn(rows, 512)
    assert rows <= weight_only_linear._WO_INT4_KERNEL_ROWS and layer._weight_only_kernel_fits(x), "precondition: the int4 kernel runs"
    if not symmetric:
        assert (layer.zero_points() != 8).any(), "precondition: zero points other than 8"
    with torch.no_grad():
        output = layer(x)
    assert list(layer._packed) == ["int4_tiles"], "no int8 codes were derived for a decode step"
    tiles, scales_and_offsets = layer.derived_weight("int4_tiles")
    assert tiles.dtype == torch.uint8 and scales_and_offsets.shape == (512 // group_size, 96, 2)
    exact = F.linear(x.bfloat16().float(), layer.dequantized_weight(), linear.bias)
    assert (output - exact).abs().max() <= exact.abs().max() * 2**-7


@pytest.mark.parametrize("dot_products", [True, False], ids=["int8_dot_products", "none"])
def test_more_rows_than_the_weight_only_kernels_take_and_untileable_layers_run_int8_gemms(dot_products, monkeypatch):
    monkeypatch.setattr(weight_only_linear, "_wo_vnni", lambda: dot_products)
    torch.manual_seed(0)
    tileable = WeightOnlyLinear.from_linear(nn.Linear(64, 32), 4, 32, True)
    untileable = WeightOnlyLinear.from_linear(nn.Linear(64, 40), 4, 32, True)  # 40 output rows: no whole tiles of 16
    int8 = WeightOnlyLinear.from_linear(nn.Linear(64, 32), 8, 32, True)
    narrow_int8 = WeightOnlyLinear.from_linear(nn.Linear(60, 32), 8, 32, True)  # 60 inputs: no _weight_int8pack_mm
    most = weight_only_linear._WO_INT4_KERNEL_ROWS if dot_products else weight_only_linear._WO_BF16_KERNEL_ROWS
    prompt, wide = torch.randn(most + 1, 64), torch.randn(most + 1, 60)
    with torch.no_grad():
        tileable(prompt), untileable(prompt[:1]), int8(prompt), narrow_int8(wide[:1])
    assert [list(layer._packed) for layer in (tileable, untileable, int8, narrow_int8)] == [["gemm"]] * 4


@pytest.mark.parametrize("rows", [1, 9, weight_only_linear._WO_BF16_KERNEL_ROWS])
@pytest.mark.parametrize("bits", [4, 8])
def test_without_int8_dot_products_calls_of_up_to_128_rows_run_torchs_weight_only_kernels(bits, rows, monkeypatch):
    """Where ``torch._int_mm`` loops slowly: bfloat16 activations, the int4 tiles or the int8 codes as stored, within
    bfloat16's rounding of the output (2^-8) of the codes' float formula on those activations."""
    monkeypatch.setattr(weight_only_linear, "_wo_vnni", lambda: False)
    torch.manual_seed(0)
    linear = nn.Linear(512, 96)
    layer = WeightOnlyLinear.from_linear(linear, bits, 32, bits == 8)
    x = torch.randn(rows, 512)
    assert layer._weight_only_kernel_fits(x), "precondition: a weight-only kernel runs"
    with torch.no_grad():
        output = layer(x)
    assert list(layer._packed or {}) == (["int4_tiles"] if bits == 4 else []), "no int8 GEMM's codes were derived"
    exact = F.linear(x.bfloat16().float(), layer.dequantized_weight(), linear.bias)
    assert (output - exact).abs().max() <= exact.abs().max() * 2**-7


def test_int4_tiles_are_made_a_block_of_rows_at_a_time_as_for_the_whole_weight():
    torch.manual_seed(0)
    rows = 2 * weight_only_linear._WO_ROWS_PER_BLOCK + 3 * 64  # three blocks, the last one short
    layer = WeightOnlyLinear.from_linear(nn.Linear(64, rows, bias=False), 4, 32, False)
    tiles, scales_and_offsets = layer.derived_weight("int4_tiles")
    whole = torch._convert_weight_to_int4pack_for_cpu(wo_unpack_int4(layer.weight).to(torch.int32), 1)
    assert torch.equal(tiles, whole)
    offsets = (8 - layer.zero_points().float()) * layer.weight_scale
    assert torch.equal(scales_and_offsets, torch.stack([layer.weight_scale.t(), offsets.t()], -1).bfloat16())


@pytest.mark.parametrize("quantize", [wo_quantize_int8, lambda weight: wo_quantize_int4(weight, 32, False, True)], ids=["int8", "int4"])
def test_a_wide_weight_is_quantised_a_block_of_rows_at_a_time_as_in_one_go(quantize, monkeypatch):
    torch.manual_seed(0)
    rows = 2 * weight_only_linear._WO_ROWS_PER_BLOCK + 300  # three blocks, the last one short
    weight = torch.randn(rows, 64, dtype=torch.bfloat16)
    blocked = quantize(weight)
    monkeypatch.setattr(weight_only_linear.wo_by_rows, "__defaults__", (rows,))  # one block
    whole = quantize(weight)
    assert len(blocked) == len(whole) >= 2 and blocked[0].shape[0] == rows
    for part, expected in zip(blocked, whole):
        assert part.dtype == expected.dtype and torch.equal(part, expected)


@pytest.mark.parametrize("bits,activations,copies_the_codes", [(4, "int8", True), (8, "int8", False), (8, "float", True)])
def test_pack_now_derives_the_kernels_forms_and_says_whether_they_copy_the_codes(bits, activations, copies_the_codes):
    """What ``module.py``'s load may hand back to the weights file: codes that no kernel reads any more."""
    torch.manual_seed(0)
    layer = WeightOnlyLinear.from_linear(nn.Linear(64, 32), bits, 32, True, activations=activations)
    assert layer._packed is None, "precondition: nothing derived before"
    assert layer.pack_now() is copies_the_codes
    expected = ["gemm", "int4_tiles"] if bits == 4 else ["gemm"]
    assert sorted(layer._packed) == expected
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = {form: cached[2] for form, cached in layer._packed.items()}
        layer(x), layer(torch.randn(20, 64))
    assert all(layer._packed[form][2] is derived for form, derived in before.items()), "the calls used what load derived"


def test_a_move_that_changes_nothing_keeps_what_was_derived_and_a_conversion_drops_it():
    """``module.py``'s load derives the kernels' forms, then hands the codes' pages back; ``.to("cpu")`` of the loaded
    module (the build's validation makes one) must not make every layer derive them again from those pages."""
    torch.manual_seed(0)
    layer = WeightOnlyLinear.from_linear(nn.Linear(64, 32, bias=False), 4, 32, False)
    layer.pack_now()
    derived = {form: cached[2] for form, cached in layer._packed.items()}
    assert sorted(derived) == ["gemm", "int4_tiles"], "precondition: both forms derived"
    layer.to("cpu").float()
    assert {form: cached[2] for form, cached in layer._packed.items()} == derived, "the very same derived tensors"
    x = torch.randn(20, 64)
    with torch.no_grad():
        before = layer(x)
        layer.double()  # the scales convert: what was derived from the float32 ones goes
        assert layer._packed is None
        layer.float()
        torch.testing.assert_close(layer(x), before, rtol=0, atol=0)
        layer.weight_scale.mul_(2)  # changed in place: derived again
        torch.testing.assert_close(layer(x), before * 2, rtol=0, atol=0)  # every scale a power of two times the old


@pytest.mark.parametrize("bits", [4, 8])
def test_float_activations_compute_the_codes_exact_values(bits):
    torch.manual_seed(0)
    linear = nn.Linear(256, 90)
    layer = WeightOnlyLinear.from_linear(linear, bits, 32, True, activations="float")
    x = torch.randn(5, 256)
    with torch.no_grad():
        output, float32 = layer(x), linear(x)
    torch.testing.assert_close(output, F.linear(x, layer.dequantized_weight(), linear.bias), atol=1e-5, rtol=1e-5)
    assert 0 < (output - float32).abs().max() <= layer.weight_scale.max() / 2 * x.abs().sum(dim=1).max()


def test_a_changed_weight_repacks_and_copies_drop_the_packed_tiles():
    torch.manual_seed(0)
    layer = WeightOnlyLinear.from_linear(nn.Linear(64, 32, bias=False), 4, 32, True, activations="float")
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = layer(x)
        assert layer._packed is not None
        layer.weight.copy_(wo_pack_int4(torch.full((32, 64), 9, dtype=torch.uint8)))  # every code one step above zero
        after = layer(x)
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, F.linear(x, layer.dequantized_weight()), atol=1e-5, rtol=1e-5)
    assert copy.deepcopy(layer)._packed is None and pickle.loads(pickle.dumps(layer))._packed is None


def test_outside_the_kernel_the_float_formula_runs():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    layer = WeightOnlyLinear.from_linear(linear, 4, 32, False)
    x = torch.randn(2, 64, dtype=torch.float64)
    assert not layer._use_kernel(x)
    torch.testing.assert_close(layer(x), F.linear(x, layer.dequantized_weight().double(), linear.bias.double()))


def test_the_int8_regrid_of_a_wide_layer_goes_a_block_of_rows_at_a_time():
    torch.manual_seed(0)
    rows = 2 * weight_only_linear._WO_ROWS_PER_BLOCK + 300  # three blocks, the last one short
    layer = WeightOnlyLinear.from_linear(nn.Linear(64, rows, bias=False), 4, 32, False)
    codes, scale = layer.derived_weight()
    whole = layer.dequantized_weight()
    expected_scale = whole.abs().amax(dim=1) / 127
    torch.testing.assert_close(scale, expected_scale)
    assert torch.equal(codes, torch.round(whole / expected_scale[:, None]).clamp(-127, 127).to(torch.int8))
    assert torch.equal(layer.dequantized_weight(slice(1000, 1100)), whole[1000:1100])


def test_float_zero_points_travel_through_module_py_as_float32(tmp_path):
    """The saved module.py constructs the layer with float zero points, so its float32 zeros load as they were (a uint8
    buffer would truncate them), and computes what the graph in memory does, a decode step's rows and a prompt's."""
    import safetensors

    from aot.export import save_graph_module
    from aot.export.graph_module_artifact import load_standalone

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.SiLU(), nn.Linear(32, 16)).eval()
    graph_module = fx_graph(model, torch.randn(2, 64))
    QuantizeLinearWeights(bits=4, group_size=32, symmetric=False, zero_point="float")(graph_module)
    zeros = [m.weight_zero for m in graph_module.modules() if isinstance(m, WeightOnlyLinear)]
    assert len(zeros) == 2 and all(z.dtype == torch.float32 and (z != z.round()).any() for z in zeros), "precondition"
    save_graph_module(graph_module, tmp_path)
    assert "zero_point='float'" in (tmp_path / "module.py").read_text()
    with safetensors.safe_open(tmp_path / "weights.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys() if name.endswith("weight_zero")} == {"F32"}
    loaded = load_standalone(tmp_path)
    for rows in (1, 12):
        x = torch.randn(rows, 64)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), graph_module(x), rtol=0, atol=0)
