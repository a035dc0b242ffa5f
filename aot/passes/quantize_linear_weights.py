"""QuantizeLinearWeights: linear layers with int4 (per group) or int8 (per channel) weights, float activations.

A decoder generating one token reads every weight once, so its speed is the bytes of its weights
over the memory bandwidth: int4 weights read an eighth of float32's. Matches (``fx`` frontend)
every float32 ``nn.Linear`` call whose path no ``skip`` pattern names::

    h = self.model.layers.0.mlp.down_proj(x)       # nn.Linear(8192, 2048, bias=False), float32

Rewrites to::

    h = self.model.layers.0.mlp.down_proj(x)       # aot.runtime.WeightOnlyLinear(8192, 2048, bias=False,
                                                    #     bits=4, group_size=32, symmetric=True)

Math, for each group ``w`` of ``g = group_size`` consecutive weights of a row (int4), or each
row (int8)::

    int4, symmetric:   s = max|w| / 7,   q = clamp(round(w / s), -8, 7) + 8,   z = 8
    int4, asymmetric:  lo = min(min w, 0), hi = max(max w, 0), s = (hi - lo) / 15,
                       z = clamp(round(-lo / s), 0, 15),   q = clamp(round(w / s) + z, 0, 15)
      zero_point float: lo = min w, hi = max w, s = (hi - lo) / 15, z = -lo / s, q = clamp(round(w / s + z), 0, 15)
    int8:              s = max|w| / 127,  q = clamp(round(w / s), -127, 127),   z = 0
    y = x · ((q - z) · s)^T + b

**Grids per layer.** ``layers`` maps ``fnmatch`` patterns on module paths to a grid of their own, the first
pattern that names a layer winning (``{"*down_proj": {bits: 8}, "*self_attn*": {bits: 4, group_size: 64}}``);
other layers take ``bits`` and ``group_size``. With ``auto: true`` they take instead, per layer kind
(``model.layers.*.mlp.down_proj``), the candidate of ``auto_grids`` with the fewest bytes that keeps the recipe's
fidelity gate, measured on its calibration texts (:mod:`aot.passes._grid_search`); the choice and every figure
behind it go to the pass's findings in the manifest.

``method: gptq`` keeps the grid and picks the codes by GPTQ instead (:mod:`aot.passes._gptq`):
each layer's weights are rounded one input column at a time, each column's error made up by the
columns after it, weighted by ``H = Σ x xᵀ`` of the inputs the layer sees on the recipe's
calibration texts (``generation.calibration``). Layers are calibrated a few at a time in graph
order (their ``H`` within ``gptq_memory_mib``), the graph run on the texts with the layers before
them already quantised, so each is fitted to the inputs it will get. ``H`` waits in the layer's
first call node's ``meta`` until the layer is rewritten.

Each weight moves by at most ``s / 2`` (rounding to nearest), so this pass does not preserve the computation: a
decoder recipe using it names a fidelity gate (``generation.fidelity``: KL divergence and top-1
agreement of next-token distributions, greedy agreement), an encoder an accuracy gate.

With ``activations: int8`` (the default) each artifact runs its fastest CPU kernels, which round
the activations too: ONNX Runtime's ``MatMulNBits`` at ``accuracy_level=4`` (int8, per block) in the
ONNX model (:mod:`aot.export.onnx_weight_only`); in the saved GraphModule
(:mod:`aot.runtime.weight_only_linear`) torch's int4 kernel on bfloat16 activations for a decode
step's few tokens and ``torch._int_mm`` on int8 activations for a prompt's, on the very same codes
and scales. With ``float`` both compute in float32.

Left alone, with a note: layers named by ``skip`` (``fnmatch`` patterns on the module path),
an output projection named ``lm_head`` unless ``lm_head: true``, subclasses of ``nn.Linear``
and layers with hooks, layers that do not compute in float32 (an ``UpcastLinear``'s narrow weight,
widened where used, does) or are not on the CPU, int4 layers whose input
width the group size does not divide, and calls with unusual arguments. Embedding tables stay
float: a lookup reads a few rows, not the table, so quantising them saves bytes on disk but no
time. A layer called at several sites is converted once and serves them all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.fx import GraphModule

from aot.errors import PassError
from aot.runtime.weight_only_linear import WeightOnlyLinear

from ._gptq import gptq_quantize
from ._grid_search import FidelityProbe, KindChoice, choose_grids
from ._input_hessians import calibration_inputs, input_hessians
from ._modules import set_submodule
from ._quantizable_linears import LinearLayer, describe, linear_layers, quantizable_miss
from ._weight_grids import DEFAULT_AUTO_GRIDS, LayerGrid, grid_fits, layer_kind, named_grid, stored_bytes
from .base import FIDELITY_TARGET_KEY
from .registry import register_pass
from .rule import Match, RewriteRule

logger = logging.getLogger(__name__)

HESSIAN_KEY = "aot_input_hessian"  # node.meta of a layer's first call: its H, from calibration to its rewrite
GRID_KEY = "aot_weight_grid"  # node.meta of a layer's first call: auto's choice of its grid, until its rewrite


@register_pass("quantize_linear_weights", frontends=("fx",))
class QuantizeLinearWeights(RewriteRule):
    """Runs nn.Linear layers with int4 or int8 weights and float activations (not computation-preserving)."""

    preserves_computation = False

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        bits: Literal[4, 8] = Field(default=4, description="4: int4 codes in groups of `group_size` weights; 8: int8, one scale per output channel.")
        group_size: Literal[32, 64, 128, 256] = Field(
            default=32, description="int4: weights sharing one scale (and zero point), along a row; smaller keeps more accuracy.",
        )
        symmetric: bool = Field(
            default=True, description="int4: zero point fixed at 8 (true), or one per group fitted to its range (false). int8 is symmetric.",
        )
        zero_point: Literal["integer", "float"] = Field(
            default="integer",
            description="int4, symmetric: false: `integer` zero points (0..15; the group's range stretched to hold 0), or "
            "`float` ones (the group's range exactly, W = min + q·s: llama.cpp's Q4_1 grid, torchao's float zero point), "
            "which re-encode a checkpoint already rounded to that grid without loss. ONNX Runtime's fast MatMulNBits takes "
            "integer zero points only: with `float` the ONNX model adds each group's offset as a float32 product of the "
            "group's input sums, which reads a quarter more bytes a step than the codes and scales alone.",
        )
        activations: Literal["int8", "float"] = Field(
            default="int8",
            description="How the product runs: `int8` is the fast path on CPUs, rounding the activations (MatMulNBits "
            "accuracy_level 4 in ONNX: int8 per block; in module.py torch's int4 kernel on bfloat16 activations for a decode "
            "step, torch._int_mm on int8 activations for a prompt); `float` multiplies float32 activations by the dequantized "
            "weight (float32 speed, the codes' exact values).",
        )
        lm_head: bool = Field(
            default=True, description="Quantise the output projection (a layer named `lm_head`), often the largest single weight.",
        )
        method: Literal["nearest", "gptq"] = Field(
            default="nearest",
            description="How weights become codes on the grid: `nearest` rounds each weight alone; `gptq` rounds a layer's "
            "input columns in turn, each column's error made up by the columns after it, weighted by the layer's inputs on "
            "the recipe's calibration texts (generation.calibration): slower to build, closer to the float model.",
        )
        damping: float = Field(
            default=0.01, gt=0, le=1, allow_inf_nan=False,
            description="gptq: added to the diagonal of each layer's input statistics H, as a share of its mean.",
        )
        act_order: bool = Field(
            default=True,
            description="gptq: round a layer's input columns largest mean square input first, each group's grid taken "
            "before any column moves (GPTQ's act-order with static groups); false: in column order, each group's grid "
            "taken when its first column comes up.",
        )
        gptq_memory_mib: float = Field(
            default=512.0, gt=0, allow_inf_nan=False,
            description="gptq: the most MiB of layer input statistics (in_features² float32 each) held at once; layers "
            "are calibrated as many at a time as fit (at least one), each group a run of the graph on the texts.",
        )
        skip: list[str] = Field(
            default=[],  # pydantic copies it per instance; a literal default is what `aot passes` prints
            description="fnmatch patterns on module paths (e.g. 'model.layers.0.*') of linear layers to keep in float32.",
        )
        layers: dict[str, LayerGrid] = Field(
            default={},
            description="fnmatch patterns on module paths, each with its own grid ({bits: 8}, or {bits: 4, group_size: 64}); "
            "the first pattern that names a layer wins, the others take `bits` and `group_size` (or auto's choice). "
            "`symmetric` and `zero_point` hold for every int4 grid.",
        )
        auto: bool = Field(
            default=False,
            description="Choose each layer kind's grid (model.layers.*.mlp.down_proj...) among `auto_grids`: the fewest "
            "bytes whose weights, measured on the recipe's calibration texts, keep `auto_margin` of its fidelity gate "
            "(generation.fidelity). Layers `layers` names keep their grid. The choice and its figures go to the manifest.",
        )
        auto_grids: list[LayerGrid] = Field(
            default=DEFAULT_AUTO_GRIDS, min_length=1, description="auto: the candidate grids.",
        )
        auto_margin: float = Field(
            default=0.5, gt=0, le=1, allow_inf_nan=False,
            description="auto: the share of the fidelity gate the rounded weights may spend, measured in float32; the "
            "rest is left to each artifact's rounding of the activations.",
        )

        @model_validator(mode="after")
        def _float_zero_points_are_asymmetric_int4(self):
            if self.zero_point == "float" and (self.symmetric or self.bits == 8):
                raise ValueError("zero_point: float is for asymmetric int4 groups: set bits: 4 and symmetric: false")
            return self

    def needs_calibration(self) -> bool:
        return self.options.method == "gptq" or self.options.auto

    def needs_fidelity_target(self) -> bool:
        return self.options.auto

    def transform(self, graph_module: GraphModule) -> GraphModule:
        if self.needs_calibration() and not calibration_inputs(graph_module):
            needing = "auto" if self.options.auto else "method gptq"
            raise PassError(f"{needing} needs calibration texts to run the graph on: add generation.calibration to the recipe")
        if self.options.auto:
            self._choose_grids(graph_module)
        return super().transform(graph_module)

    def candidates(self, graph_module: GraphModule) -> Iterator[Match[LinearLayer]]:
        """Each nn.Linear with all its call sites: one module, quantised once."""
        return linear_layers(graph_module)

    def check(self, graph_module: GraphModule, layer: LinearLayer) -> Match[LinearLayer]:
        target, _ = layer
        if not self.options.lm_head and target.split(".")[-1] == "lm_head":
            return Match.fail(f"{describe(layer)}: the output projection, kept in float32 (lm_head: false)")
        miss = quantizable_miss(graph_module, layer, self.options.skip, "weight-only quantisation")
        if miss:
            return Match.fail(miss)
        miss = grid_fits(self._grid(layer), graph_module.get_submodule(target).in_features)
        if miss:
            return Match.fail(f"{describe(layer)}: {miss}")
        return Match.ok(layer)

    def rewrite(self, graph_module: GraphModule, layer: LinearLayer) -> None:
        target, nodes = layer
        linear = graph_module.get_submodule(target)
        options, grid = self.options, self._grid(layer)
        symmetric, zero_point = grid.encoding(options.symmetric, options.zero_point)
        quantized = None
        if options.method == "gptq":  # H is handed over, not kept here: gptq_quantize frees it as it goes
            quantized = gptq_quantize(linear.weight, self._hessian(graph_module, layer), grid.bits, grid.groups,
                                      symmetric, options.damping, options.act_order, zero_point == "float")
        set_submodule(graph_module, target, WeightOnlyLinear.from_linear(linear, grid.bits, grid.groups, symmetric,
                                                                         options.activations, quantized, zero_point))
        nodes[0].meta.pop(GRID_KEY, None)
        for node in nodes:
            self.mark_as_transformed(node)

    def _grid(self, layer: LinearLayer) -> LayerGrid:
        """The layer's grid: the first ``layers`` pattern naming it, else auto's choice, else ``bits``/``group_size``."""
        target, nodes = layer
        named = named_grid(target, self.options.layers)
        if named is not None:
            return named[1]
        if GRID_KEY in nodes[0].meta:
            return nodes[0].meta[GRID_KEY]
        return LayerGrid(bits=self.options.bits, group_size=self.options.group_size if self.options.bits == 4 else None)

    def _choose_grids(self, graph_module: GraphModule) -> None:
        """auto: each kind's grid, chosen by measured fidelity (:mod:`aot.passes._grid_search`), in its layers' ``meta``."""
        target = graph_module.meta.get(FIDELITY_TARGET_KEY) or {}
        if not target:
            raise PassError("auto needs a fidelity gate to keep: generation.fidelity with max_kl_mean, max_kl or min_top1_agreement")
        target = {name: value * self.options.auto_margin if name != "top1_agreement" else 1 - (1 - value) * self.options.auto_margin
                  for name, value in target.items()}
        layers = [found.value for found in linear_layers(graph_module)
                  if found and named_grid(found.value[0], self.options.layers) is None and self._quantizable(graph_module, found.value)]
        heads = [layer for layer in linear_layers(graph_module) if layer and layer.value[0].split(".")[-1] == "lm_head"]
        if len(heads) != 1:
            raise PassError("auto scores next-token distributions: it needs the decoder's output projection, a layer named lm_head")
        kinds: dict[str, KindChoice] = {}
        for target_path, nodes in layers:
            linear = graph_module.get_submodule(target_path)
            kind = kinds.setdefault(layer_kind(target_path), KindChoice([], [], {}, {}))
            kind.layers.append(target_path)
            kind.grids = [grid for grid in self.options.auto_grids if grid_fits(grid, linear.in_features) is None
                          and (not kind.grids or grid in kind.grids)]
        unfit = [name for name, kind in kinds.items() if not kind.grids]  # they take bits and group_size
        for name in unfit:
            del kinds[name]
        for kind in kinds.values():
            for grid in kind.grids:
                kind.bytes[grid.label] = sum(stored_bytes(graph_module.get_submodule(layer), grid, self.options.symmetric,
                                                          self.options.zero_point) for layer in kind.layers)
            kind.grids.sort(key=lambda grid: kind.bytes[grid.label])
        probe = FidelityProbe(graph_module, calibration_inputs(graph_module), heads[0].value[0], self.options.symmetric, self.options.zero_point)
        measured, tries = choose_grids(probe, kinds, target)
        for (target_path, nodes) in layers:
            kind = kinds.get(layer_kind(target_path))
            if kind is not None:
                nodes[0].meta[GRID_KEY] = kind.grid
        float_bytes = sum(graph_module.get_submodule(layer).weight.numel() * 4 for kind in kinds.values() for layer in kind.layers)
        self.report.findings["auto"] = {
            "target": {name: round(value, 6) for name, value in target.items()}, "margin": self.options.auto_margin,
            "texts": probe.texts, "positions": probe.positions,
            "kinds": {name: kind.to_json() for name, kind in kinds.items()},
            "tries": tries, "measured": measured.to_json(),
            # False: no candidate kept the target, every kind is on its most precise grid and the build's gate decides
            "target_met": measured.share(target) <= 1,
            "no_candidate_fits": unfit,
            "bytes": sum(kind.bytes[kind.grid.label] for kind in kinds.values()), "float32_bytes": float_bytes,
        }

    def _quantizable(self, graph_module: GraphModule, layer: LinearLayer) -> bool:
        target, _ = layer
        if not self.options.lm_head and target.split(".")[-1] == "lm_head":
            return False
        return quantizable_miss(graph_module, layer, self.options.skip, "weight-only quantisation") is None

    def _hessian(self, graph_module: GraphModule, layer: LinearLayer):
        """``layer``'s H, taken (with those of the layers after it that fit in ``gptq_memory_mib``) when first asked for."""
        target, nodes = layer
        if HESSIAN_KEY not in nodes[0].meta:
            batch = self._calibration_batch(graph_module, target)
            logger.info("gptq: calibrating %d layers from '%s' on %d texts", len(batch), target,
                        len(calibration_inputs(graph_module)))
            hessians = input_hessians(graph_module, {name: len(calls) for name, calls in batch})
            for name, calls in batch:  # every layer has its H: a graph has no branches, and a run stops only once all are seen
                calls[0].meta[HESSIAN_KEY] = hessians.pop(name)
        return nodes[0].meta.pop(HESSIAN_KEY)

    def _calibration_batch(self, graph_module: GraphModule, first: str) -> list[LinearLayer]:
        """``first`` and the layers this pass will rewrite after it, in graph order, whose H fit in ``gptq_memory_mib``."""
        batch, budget = [], self.options.gptq_memory_mib * 2**20
        for found in linear_layers(graph_module):
            if not found or not self.check(graph_module, found.value) or (not batch and found.value[0] != first):
                continue
            size = graph_module.get_submodule(found.value[0]).in_features ** 2 * 4
            if batch and size > budget:
                break
            batch.append(found.value)
            budget -= size
        return batch
