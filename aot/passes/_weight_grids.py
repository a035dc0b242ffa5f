"""Weight grids of ``quantize_linear_weights``: int4 in groups of 32/64/128/256, or int8 per output channel.

A grid is what a layer's weights are rounded to; its cost is the bytes the layer then stores, which a
decode step reads once a token. Per layer, the grid is the first ``layers`` pattern that names it, else
``auto``'s choice for the layer's kind, else the pass's own ``bits``/``group_size``.

A layer's *kind* is its module path with the layer index replaced: ``model.layers.*.mlp.down_proj``.
Layers of a kind do the same job in every block, so ``auto`` measures and chooses per kind.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from aot.runtime.weight_only_linear import WeightOnlyLinear


class LayerGrid(BaseModel):
    """One grid: ``{bits: 4, group_size: 64}`` or ``{bits: 8}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    bits: Literal[4, 8] = Field(description="4: int4 codes in groups of `group_size` weights; 8: int8, one scale per output channel.")
    group_size: Literal[32, 64, 128, 256] | None = Field(default=None, description="int4: weights sharing one scale; 32 when left out.")

    @model_validator(mode="after")
    def _group_size_is_for_int4(self):
        if self.bits == 8 and self.group_size is not None:
            raise ValueError("group_size is for int4 grids: int8 has one scale per output channel")
        return self

    @property
    def groups(self) -> int:
        """The group size as the kernels take it (int8: unused, 32)."""
        return self.group_size or 32

    def encoding(self, symmetric: bool, zero_point: str) -> tuple[bool, str]:
        """The pass's ``symmetric`` and ``zero_point`` as this grid takes them: int8 is symmetric, one scale per output
        channel, and a symmetric grid's zero point is the integer 8."""
        symmetric = symmetric or self.bits == 8
        return symmetric, zero_point if not symmetric else "integer"

    @property
    def label(self) -> str:
        return "int8" if self.bits == 8 else f"int4_g{self.groups}"


DEFAULT_AUTO_GRIDS = [LayerGrid(bits=4, group_size=128), LayerGrid(bits=4, group_size=64), LayerGrid(bits=4, group_size=32), LayerGrid(bits=8)]


def layer_kind(target: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.*.mlp.down_proj``."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", target)


def named_grid(target: str, layers: dict[str, LayerGrid]) -> tuple[str, LayerGrid] | None:
    """The first ``layers`` pattern that names ``target``, with its grid; None when none does."""
    return next(((pattern, grid) for pattern, grid in layers.items() if fnmatch.fnmatchcase(target, pattern)), None)


def grid_fits(grid: LayerGrid, in_features: int) -> str | None:
    """Why ``grid`` cannot hold a layer of ``in_features`` inputs, or None."""
    if grid.bits == 4 and in_features % grid.groups:
        return f"{in_features} input features are no whole number of groups of {grid.groups}"
    if grid.bits == 8 and in_features % 16:
        return f"{in_features} input features are no multiple of 16, the smallest MatMulNBits block"
    return None


def stored_bytes(linear: torch.nn.Linear, grid: LayerGrid, symmetric: bool, zero_point: str) -> int:
    """The bytes the layer's weight holds on ``grid``: codes, scales and zero points, as the artifacts store them."""
    symmetric, zero_point = grid.encoding(symmetric, zero_point)
    shape = WeightOnlyLinear(linear.in_features, linear.out_features, bias=False, bits=grid.bits, group_size=grid.groups,
                             symmetric=symmetric, zero_point=zero_point, device="meta")
    return sum(buffer.numel() * buffer.element_size() for buffer in shape.buffers())
