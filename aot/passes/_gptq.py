"""GPTQ: a linear layer's weights rounded one input column at a time, each column's error made up by the columns after it.

Rounding each weight to its nearest code (``quantize_linear_weights``' default) makes each weight's
error as small as it can be, but not the layer's: what a layer must keep is ``y = x · Wᵀ`` on the
inputs it sees. With ``H = Σ x xᵀ`` over the calibration inputs' rows (``in x in``), the output
error of a weight change ``ΔW`` is ``Σ ‖x · ΔWᵀ‖² = tr(ΔW · H · ΔWᵀ)``, row by row. GPTQ
(Frantar et al. 2022, arXiv 2210.17323, Algorithm 1) rounds the columns in order; after rounding
column ``j`` (error ``e = w_j - q_j``), it moves the columns not yet rounded to where they best
make up for it, using the upper Cholesky factor ``U`` of ``H⁻¹``::

    δ = e / U[j, j]
    W[:, j+1:] -= δ ⊗ U[j, j+1:]

Lazily: inside a block of columns the update runs column by column; the columns after the block
get the block's updates at once (``W[:, end:] -= Δ · U[block, end:]``), which is the same sum.

The codes are ``quantize_linear_weights``' own: for int4 the scale and zero point of a group are
taken (as rounding to nearest takes them) from the group's weights as they stand when its first
column comes up, so a group's columns share the grid they are rounded on; int8's per-row scale is
taken from the whole row before any column moves.

``act_order`` rounds the columns in order of ``diag H``, largest first (GPTQ's "act-order"): the
inputs that carry the most energy are rounded while the most columns are left to make up for
them. Columns of one group are then no longer adjacent in that order, so every group's grid is
taken from the weights before any column moves ("static groups"); the codes keep the layout the
kernels read (no permutation is stored). ``H`` is damped (``+ λ · mean(diag H) · I``,
GPTQ's 1%) so that it is invertible when the calibration has fewer rows than the layer has inputs,
and an input that was always 0 keeps weight 0. With ``H = I`` no column moves another: GPTQ is
then rounding to nearest, code for code.

The artifacts never run this: it is build time only, in float32 on the CPU. torchao's GPTQ
(``torchao.prototype.gptq``) is CUDA-only and writes its own int4 layout, not these codes.
"""

from __future__ import annotations

import torch

from aot.runtime.weight_only_linear import wo_by_rows, wo_int4_codes, wo_int4_grid, wo_int8_scale, wo_pack_int4

BLOCK_COLUMNS = 128  # columns updated one by one before the rest get their update at once (GPTQ's lazy batch)
ROWS_PER_BLOCK = 4096  # output rows rounded together: their float32 working copy is what a layer costs beyond H


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int, symmetric: bool,
                  damping: float = 0.01, act_order: bool = False, float_zero: bool = False) -> tuple[torch.Tensor, ...]:
    """``weight`` (out, in) rounded by GPTQ against ``hessian`` (in, in, ``Σ x xᵀ``): what ``wo_quantize_int4``
    (packed codes, scales, zero points) or ``wo_quantize_int8`` (codes, scales) returns for the same grid.

    ``hessian`` is used up (changed in place, where it is float32): at Llama-3.2-1B's down projection it is 256 MiB,
    and each step below holds at most two such matrices. A row's updates involve that row alone, so the rows go
    ``ROWS_PER_BLOCK`` at a time: a float32 working copy of a block, not of a 128,256-row output projection (1 GiB
    at Llama-3.2-1B's)."""
    hessian = hessian.float()
    dead = torch.diagonal(hessian) == 0  # inputs that were always 0: their weights become 0
    hessian[dead, dead] = 1
    order = torch.argsort(torch.diagonal(hessian), descending=True, stable=True) if act_order else None
    if order is not None:
        hessian = hessian[order]  # rows, then columns: two matrices alive at a time, not three
        hessian = hessian[:, order]
    hessian.diagonal().add_(damping * torch.diagonal(hessian).mean())
    factor = torch.linalg.cholesky(hessian)  # each step rebinds its name: the matrix before it is freed
    del hessian
    factor = torch.cholesky_inverse(factor)
    factor = torch.linalg.cholesky(factor, upper=True)  # U, upper triangular, with Uᵀ U = (H + λ I)⁻¹
    return wo_by_rows(weight, lambda rows: _gptq_rows(rows, factor, dead, order, bits, group_size, symmetric, float_zero),
                       ROWS_PER_BLOCK)


def _gptq_rows(rows: torch.Tensor, factor: torch.Tensor, dead: torch.Tensor, order: torch.Tensor | None, bits: int,
               group_size: int, symmetric: bool, float_zero: bool) -> tuple[torch.Tensor, ...]:
    work = rows.detach().float().clone()
    work[:, dead] = 0
    in_features = work.shape[1]
    group = group_size if bits == 4 else in_features
    static = order is not None or bits == 8  # every grid known before any column moves
    starts = range(0, in_features, group)
    grids = [_grid(work[:, start:start + group], bits, symmetric, float_zero) if static else None for start in starts]
    if order is not None:
        work = work[:, order]
    block = BLOCK_COLUMNS if static else max(BLOCK_COLUMNS, group)  # else a group's grid sees its block's updates
    codes = torch.empty(work.shape, dtype=torch.uint8 if bits == 4 else torch.int8)
    for start in range(0, in_features, block):
        end = min(start + block, in_features)
        columns = work[:, start:end]  # a view: updates land in ``work``
        errors = torch.empty_like(columns)
        for offset in range(end - start):
            index = start + offset
            column_group = (order[index].item() if order is not None else index) // group
            if not static and index % group == 0:  # the group's grid, from its weights as they stand now
                grids[column_group] = _grid(work[:, index:index + group], bits, symmetric, float_zero)
            column = columns[:, offset]
            code, value = _round(column, bits, *grids[column_group], float_zero)
            codes[:, index] = code.to(codes.dtype)
            errors[:, offset] = (column - value) / factor[index, index]
            columns[:, offset:] -= errors[:, offset, None] * factor[index, index:end]
        work[:, end:] -= errors @ factor[start:end, end:]
    if order is not None:
        codes = codes[:, torch.argsort(order)]
    scales, zeros = (torch.stack(values, dim=1) for values in zip(*grids))
    if bits == 8:
        return codes, scales[:, 0].contiguous()
    return wo_pack_int4(codes), scales.contiguous(), zeros.contiguous() if float_zero else zeros.to(torch.uint8)


def _grid(columns: torch.Tensor, bits: int, symmetric: bool, float_zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point (out,) of a group's (or, int8, a row's) weights as they stand."""
    if bits == 8:
        return wo_int8_scale(columns), torch.zeros(columns.shape[0])
    return wo_int4_grid(columns, symmetric, float_zero)


def _round(column: torch.Tensor, bits: int, scale: torch.Tensor, zero: torch.Tensor,
           float_zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A column's codes and the weights they stand for."""
    if bits == 8:
        code = torch.clamp(torch.round(column / scale), -127, 127)
        return code, code * scale
    code = wo_int4_codes(column, scale, zero, float_zero)
    return code, (code - zero) * scale
