"""The int8 runtimes' exact sums: torch._int_mm, or float32 GEMMs over blocks where it is slow, bit for bit alike.

Both runtime modules carry the function (each is pasted alone into a module.py), so both are tested here, the
float path forced on any CPU by saying the CPU has no int8 dot products.
"""

from __future__ import annotations

import pytest
import torch

from aot.runtime import int8_linear, weight_only_linear

SUMS = {
    "int8_linear": (int8_linear, "_int8_sums", "_int8_vnni", "_INT8_EXACT_DEPTH", "_INT8_FLOAT_GEMM_ROWS"),
    "weight_only_linear": (weight_only_linear, "_wo_int8_sums", "_wo_vnni", "_WO_EXACT_DEPTH", "_WO_FLOAT_GEMM_ROWS"),
}


def _float_path(monkeypatch, module, vnni: str):
    monkeypatch.setattr(module, vnni, lambda: False)


@pytest.mark.parametrize("runtime", SUMS)
def test_float_blocks_sum_the_largest_products_exactly(monkeypatch, runtime):
    module, sums, vnni, depth, min_rows = SUMS[runtime]
    block = getattr(module, depth)
    assert block * 127 * 127 < 2**24, "precondition: a block's partial sums stay where float32 holds integers exactly"
    _float_path(monkeypatch, module, vnni)
    inputs = 3 * block + 7  # three full blocks and a ragged one, sums far beyond 2^24
    quantized = torch.full((getattr(module, min_rows), inputs), 127, dtype=torch.int8)
    codes = torch.full((5, inputs), -127, dtype=torch.int8)
    codes[1] = 127
    got = getattr(module, sums)(quantized, codes)
    assert got.dtype == torch.int32
    assert (got[:, 0] == -127 * 127 * inputs).all() and (got[:, 1] == 127 * 127 * inputs).all()
    assert abs(127 * 127 * inputs) > 2**24, "precondition: one float32 GEMM over all inputs could have rounded"


@pytest.mark.parametrize("runtime", SUMS)
@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(4, 16, 24), (33, 1040, 8), (9, 2100, 40)])
def test_float_blocks_equal_int_mm_bit_for_bit(monkeypatch, runtime, rows, inputs, outputs):
    module, sums, vnni, _, min_rows = SUMS[runtime]
    assert rows >= getattr(module, min_rows), "precondition: these rows take the float path"
    generator = torch.Generator().manual_seed(rows)
    quantized = torch.randint(-127, 128, (rows, inputs), dtype=torch.int8, generator=generator)
    codes = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, generator=generator)
    _float_path(monkeypatch, module, vnni)
    assert torch.equal(getattr(module, sums)(quantized, codes), torch._int_mm(quantized, codes.t()))


@pytest.mark.parametrize("runtime", SUMS)
def test_few_rows_run_int_mm_even_without_dot_products(monkeypatch, runtime):
    module, sums, vnni, _, min_rows = SUMS[runtime]
    _float_path(monkeypatch, module, vnni)
    calls = []
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(a.shape) or torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32))
    few = torch.ones((getattr(module, min_rows) - 1, 8), dtype=torch.int8)
    getattr(module, sums)(few, torch.ones((3, 8), dtype=torch.int8))
    getattr(module, sums)(torch.ones((getattr(module, min_rows), 8), dtype=torch.int8), torch.ones((3, 8), dtype=torch.int8))
    assert calls == [few.shape], "only the call with few rows went to torch._int_mm"
