"""WeightOnlyLinear: ``nn.Linear`` with int8 or int4 weights and float activations.

Self-contained on purpose: it imports only torch and the standard library (no
``from __future__``), and its private names start with ``_wo``/``_WO``, so an artifact
writer can paste this file's source into a torch-only ``module.py``. Construct it with
plain literals, e.g.::

    WeightOnlyLinear(2048, 8192, bias=False, bits=4, group_size=32, symmetric=True, zero_point="integer", activations="int8")

Decode is bound by reading the weights once per token: int4 weights read an eighth of the
float32 bytes. Activations stay float; only the weights are rounded.

State (what ``state_dict`` and a safetensors file hold; plain tensors, no pickle):

- ``bits=8``: ``weight`` int8 ``(out, in)``, ``weight_scale`` float32 ``(out,)``, one
  symmetric scale per output channel ``c``::

      s_c = max_k |W_ck| / 127        q_ck = clamp(round(W_ck / s_c), -127, 127)        W ≈ q · s

- ``bits=4``: ``weight`` uint8 ``(out, in / 2)``, two 4-bit codes a byte, the even column in
  the low nibble (ONNX Runtime's ``MatMulNBits`` layout, row-major); ``weight_scale``
  float32 ``(out, in / g)``, one scale per group of ``g = group_size`` columns; and, when
  asymmetric, ``weight_zero`` ``(out, in / g)``: uint8 for ``zero_point="integer"``, float32 for
  ``"float"``. For a group ``w`` of a row::

      symmetric:              s = max |w| / 7,   q = clamp(round(w / s), -8, 7) + 8,   zero point z = 8
      asymmetric, integer z:  lo = min(min w, 0), hi = max(max w, 0),  s = (hi - lo) / 15,
                              z = clamp(round(-lo / s), 0, 15),  q = clamp(round(w / s) + z, 0, 15)
      asymmetric, float z:    lo = min w, hi = max w,  s = (hi - lo) / 15,  z = -lo / s,
                              q = clamp(round(w / s + z), 0, 15)
      W ≈ (q - z) · s

  An integer zero point keeps 0 on the grid (ONNX Runtime's fast ``MatMulNBits`` takes only those);
  a float one spans exactly ``[min w, max w]``, ``W ≈ lo + q · s``: the grid of llama.cpp's Q4_1 and
  of torchao's int4 weight-only (``ZeroPointDomain.FLOAT``), whose codes a checkpoint already rounded
  that way keeps to the float32 rounding of its scales.

- ``bias``: float32 ``(out,)``, kept in float.

So ``y = x (q - z)^T s + b``: each weight moves by at most ``s / 2``, which is why a pass that
makes these does not preserve the computation and a recipe using it is gated on fidelity.

How the product runs (``activations``):

- ``"int8"`` (the default), the fast path on CPUs, by the number of rows (tokens) in the call and
  whether the CPU has int8 dot products (x86's VNNI or AMX, ``_wo_vnni``):

  - up to ``_WO_INT4_KERNEL_ROWS`` rows with them (8: a decode step), ``_WO_BF16_KERNEL_ROWS`` without
    (128: a decode step and most prompts), torch's weight-only kernels on the activations rounded
    to bfloat16 (8 significant bits), their results in bfloat16 too. An int4 layer through
    ``_weight_int4pack_mm_for_cpu``, which reads the int4 codes themselves (half the bytes of int8)
    with the scales in bfloat16 (and, when asymmetric, the zero point as the offset ``(8 - z) · s``);
    its tiles are torch's own layout of the same codes, made once (by ``pack_now`` or at the first
    such call). An int8 layer, without int8 dot products only, through ``_weight_int8pack_mm`` on the
    codes as stored, its channel scales applied after in float32.
  - more rows (a longer prompt), and with int8 dot products every int8 layer: each row is rounded
    to int8 on two grids, its ``_WO_OUTLIERS_PER_ROW`` largest ``|x_rk|`` (``x_out``) on one of scale
    ``b_r = max_k |x_rk| / 127``, the rest (``x_in``) on a finer one, ``a_r = max_k |x_in,rk| / 127``,
    and both are multiplied with int8 weights by ``torch._int_mm`` (int8 x int8 -> int32), then scaled::

        y_rn = c_n · (a_r Σ_k round(x_in,rk / a_r) q8_nk + b_r Σ_k round(x_out,rk / b_r) q8_nk) + b_n

    A decoder's activations hold a few channels tens of times larger than the rest (LLM.int8()'s
    outliers); on one grid a row's (``b_r``, the per-token scale) would leave the rest a few levels.
    Measured on SmolLM2-135M's real weights (int4 layers re-gridded, int8 lm_head, in plain torch;
    16 prompts prefilled, 191 positions, against float32; KL mean / top-1): one grid a row 0.078 /
    0.81; 4 outliers a row on their own grid 0.0095 / 0.94, 8: 0.0088 / 0.93; 8 kept in float
    0.0071 / 0.93, float activations 0.0055 / 0.94. Float outliers would need the weight's columns
    they meet gathered in float, which at a decode step reads a cache line of the weight for each:
    about the weight's bytes again for the narrow layers. An int8 layer's codes
    are those weights (``c = s``); an int4 layer's are re-gridded once, at the first such call, per
    output channel: ``c_n = max_k |(q - z) s|_nk / 127``, ``q8 = round((q - z) s / c_n)``, which
    moves a weight by at most ``c_n / 2`` more (under a sixteenth of the int4 step ``s``).

  ONNX Runtime's ``MatMulNBits`` at ``accuracy_level=4`` rounds activations too (to int8, per block).
- ``"float"``: ``F.linear`` on the dequantized float32 weight ``(q - z) · s``, made once at the
  first call: float32 speed and memory, the codes' exact values (``accuracy_level=0``).

What the kernels multiply by is derived state, never saved: dropped by copies, pickling and a
``.to()`` that moves or converts the weight, rebuilt when the weight changes; ``pack_now`` derives
it ahead of the first calls, and ``module.py``'s ``load`` then hands the codes' file pages back. Two
forms of an int4 layer, for speed (``benchmarks/weight_only_kernels.py``: 32 layers of 2048 x 8192
and back, larger than the caches; 2-core AMD EPYC, AVX-512, torch 2.13, 2 threads): for one row
``_weight_int4pack_mm_for_cpu`` took 8.96 ms against ``_int_mm``'s 14.1 ms; for 8 rows 27.9 against
43.0 ms; for 16 rows 57.8 against 47.7 ms; for 128 rows 465 against 174 ms. torch's int4 kernel is
slow on float32 activations (12.0 ms for one 2048 x 8192 layer, against 0.22 ms on bfloat16): hence
the rounding. Without int8 dot products ``torch._int_mm`` loops slowly and the exact float32 sums that
stand in for it (``_wo_int8_sums``) widen the codes at every call, so torch's weight-only kernels win
up to ``_WO_BF16_KERNEL_ROWS`` rows (``benchmarks/weight_only_kernels.py``'s ``wo_`` kernels: 8 layers of
2048 x 8192 and back; 2-core AMD EPYC without AVX-512, torch 2.13, 2 threads): for one row an int8
layer took 15.5 ms against its int8 GEMMs' 95.0; for 9 rows 54.7 against 399 (an int4 layer 69.3
against 254); for 128 rows 640 against 929 (731 against 860); at 256 rows the GEMMs won, 0.89x (one
process, the two alternated, 1 thread, beside other jobs). Off the CPU, for other dtypes, with gradients, and whenever
``torch.compile``/``torch.export`` trace it, the module computes the float formula: dequantize, then
``F.linear``.
"""

import functools
import platform
import weakref

import torch
import torch.nn.functional as F

_WO_BITS = (4, 8)
_WO_GROUP_SIZES = (32, 64, 128, 256)  # powers of two: the blocks ONNX Runtime's MatMulNBits takes
_WO_ACTIVATIONS = ("int8", "float")
_WO_ZERO_POINTS = ("integer", "float")
_WO_TINY = 1e-30
_WO_ROWS_PER_BLOCK = 1024  # rows quantised, re-gridded or tiled at once (a multiple of the int4 tiles' 64 rows)
_WO_INT4_KERNEL_ROWS = 8  # with int8 dot products, calls with at most this many rows run torch's int4 kernel; see the module doc
_WO_BF16_KERNEL_ROWS = 128  # without them, calls with at most this many rows run torch's weight-only kernels; see the module doc
_WO_INT8PACK_DEPTH = 32  # _weight_int8pack_mm takes layers whose in_features this divides; see _weight_only_kernel_fits
_WO_INT4_TILE_ROWS = 16  # _convert_weight_to_int4pack_for_cpu needs a multiple of 16 output rows
_WO_EXACT_DEPTH = 1040  # 1040 · 127² < 2^24: float32 sums that many int8 products exactly (see _wo_int8_sums)
_WO_OUTLIERS_PER_ROW = 8  # each row's largest activations, on an int8 grid of their own; see _int8_product
_WO_STACKED_ROWS = 8  # calls with at most this many rows stack the outliers as rows in int8 GEMMs with dot products; see _int8_product
_WO_FLOAT_GEMM_ROWS = 4  # fewer rows than this run torch._int_mm even without int8 dot products (_wo_int8_sums)


# wo_quantize_int8, _wo_vnni and _wo_int8_sums are int8_linear.py's per-channel weights, _int8_vnni and _int8_sums
# again (and _int8_product its per-token kernel, with each token's outliers on a grid of their own), on purpose:
# each aot.runtime module is pasted alone into a module.py, so none may import another.
@functools.cache  # the CPU does not change under a process
def _wo_vnni() -> bool:
    """Whether this CPU has int8 dot products summing into int32 (x86's VNNI or AMX; any non-x86 CPU counts):
    without them ``torch._int_mm`` runs a slow loop (int8_linear.py's ``_int8_vnni`` gives the figures)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_vnni") or capabilities.get("amx_int8"))


@functools.cache  # read only by the kernel: one per layer width, not one per call on the decode path
def _wo_unit_scales(count: int) -> torch.Tensor:
    """``count`` bfloat16 ones: ``_weight_int8pack_mm``'s scales where the layer applies its own after, in float32."""
    return torch.ones(count, dtype=torch.bfloat16)


def _wo_int8_sums(quantized: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``quantized @ codes^T`` summed exactly in int32: ``torch._int_mm``, or without int8 dot products and for
    ``_WO_FLOAT_GEMM_ROWS`` rows or more, float32 GEMMs over blocks of ``_WO_EXACT_DEPTH`` inputs, within which
    float32 holds every partial sum exactly; bit for bit ``_int_mm``'s (int8_linear.py's ``_int8_sums``)."""
    if _wo_vnni() or quantized.shape[0] < _WO_FLOAT_GEMM_ROWS:
        return torch._int_mm(quantized, codes.t())
    sums = None
    for start in range(0, codes.shape[1], _WO_EXACT_DEPTH):
        block = slice(start, start + _WO_EXACT_DEPTH)
        part = torch.mm(quantized[:, block].float(), codes[:, block].float().t()).to(torch.int32)
        sums = part if sums is None else sums.add_(part)
    return sums


def wo_quantize_int8(weight: torch.Tensor):
    """``(q, s)``: symmetric int8 codes ``(out, in)`` and float32 scales ``(out,)``, per output channel."""
    return wo_by_rows(weight, _wo_quantize_int8_rows)


def wo_quantize_int4(weight: torch.Tensor, group_size: int, symmetric: bool, float_zero: bool = False):
    """``(packed, s, z)``: 4-bit codes two a byte ``(out, in/2)``, float32 scales and zero points ``(out, in/g)``,
    uint8 (float32 with ``float_zero``)."""
    return wo_by_rows(weight, lambda rows: _wo_quantize_int4_rows(rows, group_size, symmetric, float_zero))


def wo_by_rows(weight: torch.Tensor, quantize, rows_per_block: int = _WO_ROWS_PER_BLOCK):
    """``quantize`` over ``rows_per_block`` output rows at a time, its results joined: each row's codes and
    scales (or int4 tiles) depend on that row alone, so this is the whole weight's result, with temporaries of a
    block only (a 128,256-row output projection would need several GB of them at once).

    Each block's results are copied into outputs made whole once, not kept and joined at the end: glibc's malloc then
    carved the small results kept from a block out of the freed temporaries of the block before, so each block's
    temporaries took fresh heap, freed but not returned (a 128,256 x 2,048 weight to int8 grew the resident set by
    1,114 MiB for 251 MiB of codes, and now by 283-312; AMD EPYC, glibc 2.36)."""
    outputs = None
    for start in range(0, weight.shape[0], rows_per_block):
        block = slice(start, start + rows_per_block)
        parts = quantize(weight[block])  # one row of each result per row of the weight
        if outputs is None:
            outputs = tuple(part.new_empty((weight.shape[0], *part.shape[1:])) for part in parts)
        for output, part in zip(outputs, parts):
            output[block] = part
        del parts  # freed before the next block's temporaries are made
    return outputs


def wo_int8_scale(rows: torch.Tensor) -> torch.Tensor:
    """The int8 scale ``s = max |w| / 127`` of each row of ``rows`` (float32), 1 for an all-zero row."""
    largest = rows.abs().amax(dim=-1)
    return torch.where(largest > 0, largest / 127, torch.ones_like(largest)).contiguous()


def _wo_quantize_int8_rows(weight: torch.Tensor):
    values = weight.detach().float()
    scale = wo_int8_scale(values)
    return torch.clamp(torch.round(values / scale[:, None]), -127, 127).to(torch.int8), scale


def wo_int4_grid(groups: torch.Tensor, symmetric: bool, float_zero: bool = False):
    """``(s, z)`` of each group ``(..., g)`` of float32 weights (the module doc's formulas), z as float32."""
    if symmetric:
        largest = groups.abs().amax(dim=-1)
        scale = torch.where(largest > 0, largest / 7, torch.ones_like(largest))
        return scale, torch.full_like(scale, 8)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    if not float_zero:  # the range holds 0, which an integer zero point then puts on the grid
        low, high = low.clamp(max=0), high.clamp(min=0)
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: q = 0 stands for its value
    if float_zero:
        return scale, -low / scale
    return scale, torch.clamp(torch.round(-low / scale), 0, 15)


def wo_int4_codes(values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, float_zero: bool = False) -> torch.Tensor:
    """``q = clamp(round(w / s) + z, 0, 15)``, or ``clamp(round(w / s + z), 0, 15)`` for a float ``z`` (float32);
    ``scale`` and ``zero`` broadcast against ``values``. (The two differ for integer ``z`` only at ties, where
    rounding half to even depends on ``z``: integer zero points keep the first, their codes as they always were.)"""
    if float_zero:
        return torch.clamp(torch.round(values / scale + zero), 0, 15)
    return torch.clamp(torch.round(values / scale) + zero, 0, 15)


def _wo_quantize_int4_rows(weight: torch.Tensor, group_size: int, symmetric: bool, float_zero: bool):
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    scale, zero = wo_int4_grid(groups, symmetric, float_zero)
    codes = wo_int4_codes(groups, scale[..., None], zero[..., None], float_zero).to(torch.uint8)
    return (wo_pack_int4(codes.reshape(out_features, in_features)), scale.contiguous(),
            zero.contiguous() if float_zero else zero.to(torch.uint8))


def wo_pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``(out, in)`` in 0..15 as bytes ``(out, in/2)``: the even column in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def wo_unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``(out, in/2)`` back to codes ``(out, in)``, uint8 in 0..15."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


class WeightOnlyLinear(torch.nn.Module):
    """``x W^T + b`` with int8 (per channel) or int4 (per group) weights; see the module doc."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, bits: int = 4, group_size: int = 32,
        symmetric: bool = True, zero_point: str = "integer", activations: str = "int8", device=None,
    ) -> None:
        super().__init__()
        if bits not in _WO_BITS:
            raise ValueError(f"WeightOnlyLinear: bits must be one of {list(_WO_BITS)}, got {bits!r}")
        if bits == 4 and (group_size not in _WO_GROUP_SIZES or in_features % group_size):
            raise ValueError(f"WeightOnlyLinear: group_size must be one of {list(_WO_GROUP_SIZES)} and divide in_features "
                             f"{in_features}, got {group_size!r}")
        if activations not in _WO_ACTIVATIONS:
            raise ValueError(f"WeightOnlyLinear: activations must be one of {list(_WO_ACTIVATIONS)}, got {activations!r}")
        if bits == 8 and not symmetric:
            raise ValueError("WeightOnlyLinear: int8 weights are symmetric, per output channel")
        if zero_point not in _WO_ZERO_POINTS or (zero_point == "float" and (bits == 8 or symmetric)):
            raise ValueError(f"WeightOnlyLinear: zero_point must be one of {list(_WO_ZERO_POINTS)}, and 'float' only for "
                             f"asymmetric int4, got {zero_point!r}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.bits, self.group_size, self.symmetric, self.activations = int(bits), int(group_size), bool(symmetric), activations
        self.zero_point = zero_point
        if bits == 8:
            self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=torch.int8, device=device))
            self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        else:
            groups = in_features // group_size
            self.register_buffer("weight", torch.full((out_features, in_features // 2), 0x88, dtype=torch.uint8, device=device))
            self.register_buffer("weight_scale", torch.ones((out_features, groups), dtype=torch.float32, device=device))
            if not symmetric:
                zero_dtype = torch.float32 if zero_point == "float" else torch.uint8
                self.register_buffer("weight_zero", torch.full((out_features, groups), 8, dtype=zero_dtype, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=torch.float32, device=device), requires_grad=False)
        else:
            self.bias = None
        self._packed = None  # {form: (weakrefs to derived_sources(), their data pointers and versions, derived_weight(form))}

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, bits: int = 4, group_size: int = 32, symmetric: bool = True,
                    activations: str = "int8", quantized: tuple | None = None, zero_point: str = "integer") -> "WeightOnlyLinear":
        """The weight-only form of a float ``nn.Linear``: its weight quantised (rounded to nearest, or ``quantized``,
        what ``wo_quantize_int8`` / ``wo_quantize_int4`` return, found another way), its bias kept."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, bits=bits, group_size=group_size,
                     symmetric=symmetric, zero_point=zero_point, activations=activations, device="meta")
        if bits == 8:
            module.weight, module.weight_scale = quantized or wo_quantize_int8(linear.weight)
        else:
            packed, scale, zero = quantized or wo_quantize_int4(linear.weight, group_size, symmetric, zero_point == "float")
            module.weight, module.weight_scale = packed, scale
            if not symmetric:
                module.weight_zero = zero
        if linear.bias is not None:
            module.bias = torch.nn.Parameter(linear.bias.detach().float().clone(), requires_grad=False)
        return module

    def zero_points(self, rows: slice = slice(None)) -> torch.Tensor:
        """``z`` per group, ``(out, in/g)`` uint8 (8 everywhere when symmetric; float32 for float zero points), of
        ``rows``; int4 only."""
        zero = getattr(self, "weight_zero", None)
        return zero[rows] if zero is not None else torch.full_like(self.weight_scale[rows], 8, dtype=torch.uint8)

    def group_offsets(self) -> torch.Tensor:
        """``(8 - z) · s`` per group, float32 ``(out, in/g)``: what a kernel whose zero point is fixed at 8 adds to each
        group's weights to make ``(q - z) · s`` (torch's int4 kernel here; ``MatMulNBits`` at its default zero point in
        an ONNX model with float zero points); int4 only."""
        return (8 - self.zero_points().float()) * self.weight_scale

    def dequantized_weight(self, rows: slice = slice(None)) -> torch.Tensor:
        """``(q - z) · s``: the float32 weight the codes stand for (its ``rows`` only, when given)."""
        if self.bits == 8:
            return self.weight[rows].float() * self.weight_scale[rows, None]
        packed = self.weight[rows]
        codes = wo_unpack_int4(packed).float().reshape(packed.shape[0], -1, self.group_size)
        zero = self.zero_points(rows).float()[..., None]
        return ((codes - zero) * self.weight_scale[rows, :, None]).reshape(packed.shape[0], self.in_features)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._use_kernel(input):
            weight = self.dequantized_weight().to(input.dtype)
            return F.linear(input, weight, None if self.bias is None else self.bias.to(input.dtype))
        if self.activations == "float":
            return F.linear(input, self.derived_weight()[0], self.bias)
        rows = input.reshape(-1, self.in_features)
        if self._weight_only_kernel_fits(rows):
            output = self._weight_only_kernel(rows)
            if self.bias is not None:
                output.add_(self.bias)
            return output.reshape(*input.shape[:-1], self.out_features)
        codes, scale = self.derived_weight()
        output = self._int8_product(rows, codes)
        if self.bias is None:
            output.mul_(scale)
        else:
            torch.addcmul(self.bias, output, scale, out=output)
        return output.reshape(*input.shape[:-1], self.out_features)

    def _weight_only_kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows @ ((q - z) s)^T`` by torch's kernel for the codes as stored, on ``rows`` rounded to bfloat16: int4
        through its tiles, int8 by ``_weight_int8pack_mm`` with unit scales and the channel scales applied after, in
        float32 (its own would round them to bfloat16 too)."""
        activations = rows.to(torch.bfloat16)
        if self.bits == 4:
            tiles, scales_and_offsets = self.derived_weight("int4_tiles")
            return torch._weight_int4pack_mm_for_cpu(activations, tiles, self.group_size, scales_and_offsets).float()
        return torch._weight_int8pack_mm(activations, self.weight, _wo_unit_scales(self.out_features)).float().mul_(self.weight_scale)

    def _int8_product(self, rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """``x @ codes^T`` for ``rows`` (M, in) through the int8 GEMM, before the channel scales, each row on two int8
        grids: its ``_WO_OUTLIERS_PER_ROW`` largest ``|x|`` on one (scale ``b_r``, their largest / 127), the rest on a
        finer one (``a_r``, the largest of the rest / 127). Why: a decoder's activations carry a few channels tens of
        times larger than the rest, which on one grid would leave the rest a few levels (LLM.int8()'s outliers, per
        row here, so that a row's result does not depend on the rows beside it in the call).

        Both parts' sums are exact integers, so the two ways of computing the outliers' give the same bits: stacked
        as rows of their own under the one GEMM, or multiplied with only the weight's columns they meet (gathered:
        a cache line of the weight read for each of them in each row of the weight). On a CPU with int8 dot
        products a few rows (a decode step) are bound by reading the weights, so stacking them costs one more row of
        arithmetic and no more reading (reasoned, not measured: no such CPU was at hand); without them
        ``torch._int_mm``'s time grows with its rows, and stacking doubled a decode step's time where gathering
        added 15-50% (2048 x 8192 and 576 x 1536 int8 layers, one row; 2-core AMD EPYC without AVX-512, 2 threads).
        A prompt's rows gather: its outliers share few columns in a decoder."""
        count = rows.shape[0]
        outliers = min(_WO_OUTLIERS_PER_ROW, self.in_features)
        largest, where = rows.abs().topk(outliers, dim=1)  # sorted: the row's largest |x| first
        values = rows.gather(1, where)
        inliers = rows.scatter(1, where, 0.0)
        # x / a, as the ONNX model computes it (not x · (127 / max)), so that both round every value alike
        inner_scale = inliers.abs().amax(dim=1, keepdim=True).clamp_(min=_WO_TINY) / 127
        outer_scale = largest[:, :1].clamp(min=_WO_TINY) / 127
        inner = (inliers / inner_scale).round_().to(torch.int8)  # |x| <= max: within [-127, 127]
        outer = (values / outer_scale).round_()
        if count <= _WO_STACKED_ROWS and _wo_vnni():
            stacked = torch.cat([inner, torch.zeros_like(inner).scatter_(1, where, outer.to(torch.int8))])
            sums = _wo_int8_sums(stacked, codes)
            return sums[:count] * inner_scale + sums[count:] * outer_scale
        columns, slot = torch.unique(where, return_inverse=True)
        sparse = rows.new_zeros((count, columns.numel())).scatter_(1, slot, outer)
        outer_sums = sparse @ codes[:, columns].t().float()  # at most 8 products of int8 a sum: exact in float32
        return _wo_int8_sums(inner, codes) * inner_scale + outer_sums * outer_scale

    # -- derived weights -----------------------------------------------------------------------------------

    def derived_weight(self, form: str = "gemm"):
        """What a CPU kernel multiplies by, made at its first call and again when the codes change. ``form="gemm"``:
        for ``activations="int8"`` int8 codes ``(out, in)`` and their float32 scales ``(out,)`` (``_int_mm``'s), for
        ``"float"`` the dequantized float32 weight (and None); ``form="int4_tiles"``: an int4 layer's codes in torch's
        int4 tiles and their bfloat16 scales and offsets ``(in/g, out, 2)`` (``_weight_int4pack_mm_for_cpu``'s)."""
        cached = (self._packed or {}).get(form)
        if cached is not None and self._derived_is_current(cached):
            return cached[2]
        with torch.no_grad():
            if form == "int4_tiles":
                derived = self._int4_tiles()
            elif self.activations == "float":
                derived = (self.dequantized_weight(), None)
            elif self.bits == 8:
                derived = (self.weight, self.weight_scale)
            else:  # int4 codes re-gridded per output channel, see the module doc
                derived = self.int8_regrid()
        sources = self.derived_sources()
        stamps = [(tensor.data_ptr(), _wo_version(tensor)) for tensor in sources]
        self._packed = {**(self._packed or {}), form: ([weakref.ref(tensor) for tensor in sources], stamps, derived)}
        return derived

    def derived_sources(self):
        """What the derived forms are made of: the codes, their scales and zero points (the bias is used as it is).
        Once ``pack_now`` says the forms copy the codes, no kernel reads these again (``module.py``'s ``load`` hands
        their file pages back)."""
        buffers = self._buffers  # not getattr: a decode step checks every layer's sources (a missing name raises)
        return [tensor for tensor in (buffers["weight"], buffers["weight_scale"], buffers.get("weight_zero")) if tensor is not None]

    def _derived_is_current(self, cached) -> bool:
        """Whether a derived form was made from the sources as they are now: the same tensors, storage and versions."""
        references, stamps, _ = cached
        sources = self.derived_sources()
        if len(references) != len(sources):
            return False
        for reference, (pointer, version), tensor in zip(references, stamps, sources):
            if reference() is not tensor or tensor.data_ptr() != pointer or _wo_version(tensor) != version:
                return False
        return True

    def pack_now(self) -> bool:
        """Derive now, not at the first calls, what the CPU kernels multiply by; whether that is a copy of the codes
        (not the codes themselves, as an int8 layer's int8 GEMMs take them), so that ``weight``'s pages can be handed
        back to the file they were read from (``module.py``'s ``load``)."""
        probe = torch.empty((1, self.in_features), dtype=torch.float32, device=self.weight.device)
        if not self._use_kernel(probe):
            return False
        self.derived_weight()
        if self.bits == 4 and self._weight_only_kernel_fits(probe):
            self.derived_weight("int4_tiles")
        return self.activations == "float" or self.bits == 4

    def _int4_tiles(self):
        """The codes as ``_convert_weight_to_int4pack_for_cpu`` tiles them, a block of rows at a time (its input is
        int32, 8 bytes per byte of codes: a whole 128,256-row lm_head would be a transient gigabyte; the tiles of a
        block of rows are those rows' tiles), and per group ``(s, (8 - z) s)`` in bfloat16: its kernel computes
        ``(q - 8) · s + offset``, which is ``(q - z) · s``."""
        (tiles,) = wo_by_rows(self.weight, lambda rows: (torch._convert_weight_to_int4pack_for_cpu(wo_unpack_int4(rows).to(torch.int32), 1),))
        return tiles, torch.stack([self.weight_scale.t(), self.group_offsets().t()], dim=-1).to(torch.bfloat16).contiguous()

    def int8_regrid(self):
        """An int4 layer's codes as int8 per output channel, ``(codes, scales)``, made a block of rows at a time: the
        float32 weight of a 128,256 x 2,048 lm_head would be a transient gigabyte, a block of it is a few megabytes.
        What ``_int_mm`` multiplies a prompt by here, and ONNX Runtime's ``MatMulInteger`` in an ONNX model exported
        with int8 prompts (``aot.export.onnx_prompt_gemm``)."""
        codes = torch.empty((self.out_features, self.in_features), dtype=torch.int8)
        scale = torch.empty(self.out_features, dtype=torch.float32)
        for start in range(0, self.out_features, _WO_ROWS_PER_BLOCK):
            rows = slice(start, start + _WO_ROWS_PER_BLOCK)
            weight = self.dequantized_weight(rows)
            largest = weight.abs().amax(dim=1)
            scale[rows] = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
            codes[rows] = torch.round(weight / scale[rows, None]).clamp_(-127, 127)
        return codes, scale

    def _use_kernel(self, input: torch.Tensor) -> bool:
        if not isinstance(input, torch.Tensor) or input.device.type != "cpu" or input.dtype != torch.float32:
            return False  # also a torch.fx Proxy: tracing sees the float formula
        if torch.compiler.is_compiling():
            return False  # torch.export / torch.compile see the float formula
        if input.dim() == 0 or input.shape[-1] != self.in_features or input.numel() == 0:
            return False
        if torch.is_grad_enabled() and input.requires_grad:
            return False  # the kernels have no backward
        if self.weight.device.type != "cpu":
            return False
        return self.activations == "float" or hasattr(torch, "_int_mm")

    def _weight_only_kernel_fits(self, rows: torch.Tensor) -> bool:
        """Whether a call of ``rows`` runs :meth:`_weight_only_kernel` (see the module doc for when). int8 layers only
        without int8 dot products (not measured with them), and only those whose ``in_features`` ``_WO_INT8PACK_DEPTH``
        divides: with 60 or 100, ``_weight_int8pack_mm`` summed wrongly for more than one row, or crashed (torch 2.13,
        AVX2), with multiples of 8 it summed right."""
        if rows.shape[0] > (_WO_INT4_KERNEL_ROWS if _wo_vnni() else _WO_BF16_KERNEL_ROWS):
            return False
        if self.bits == 4:
            return self.out_features % _WO_INT4_TILE_ROWS == 0 and hasattr(torch, "_weight_int4pack_mm_for_cpu")
        return not _wo_vnni() and self.in_features % _WO_INT8PACK_DEPTH == 0 and hasattr(torch, "_weight_int8pack_mm")

    # -- derived state stays out of copies, pickles and moves -------------------------------------------------

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        # Kept when the move changed nothing (``.to("cpu")`` of a CPU module returns the same tensors): dropped, the
        # forms would be derived again from the codes at the next calls, whose file pages ``module.py``'s load handed
        # back would then be read in again and stay resident beside them.
        current = {form: cached for form, cached in (self._packed or {}).items() if self._derived_is_current(cached)}
        self._packed = current or None
        return module

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_packed"] = None
        return state

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"bits={self.bits}, group_size={self.group_size}, symmetric={self.symmetric}, "
                + ("zero_point='float', " if self.zero_point == "float" else "")  # the default unsaid, as module.py's call
                + f"activations={self.activations!r}")


def _wo_version(tensor: torch.Tensor):
    """The in-place version counter; None for inference tensors, which have none."""
    try:
        return tensor._version
    except RuntimeError:
        return None
