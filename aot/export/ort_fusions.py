"""Fuse an exported ONNX model into ONNX Runtime's contrib ops, in memory, before it is written.

The rules are onnxscript's (``onnxscript.rewriter.ort_fusions``); what this
module chooses is which of them run, and what runs before them. onnxscript's
own ``optimize_for_ort`` takes ~4 s on BERT-base (its optimiser runs three
times, deduplicating 400 MB of initializers and eliminating common
subexpressions on each run); the sequence below takes under 1 s and yields the
same fused ops::

    fold constants (with shape inference)     Shape -> Gather -> Concat -> Reshape chains become constants
    shape_optimization rules, fold again      the size arithmetic the fx graph carries disappears
    erf-GELU      x * 0.5 * (1 + Erf(x / sqrt 2))                  -> Gelu
    SDPA          Softmax(Q K^T * scale + mask) V                   -> SDPA (onnxscript's intermediate)
    MHA           Reshape/Transpose around SDPA on [B, S, H*D]      -> MultiHeadAttention
    SDPA left     an SDPA no MHA pattern consumed                   -> MultiHeadAttention, reshaped around
                  (onnxscript's own last step: torch 2.15 exports BERT's first layer in a form the
                  MHA patterns miss, and an SDPA left behind is an op ONNX Runtime does not know)
    bias-GELU     Gelu(x + b)                                       -> BiasGelu
    skip-LayerNorm LayerNorm(x + residual (+ b))  (CUDA only)       -> SkipLayerNormalization
    then aot's own rules for the target (:mod:`aot.export.onnx_rules`), on CPU:
    feed-forward  MatMul -> BiasGelu -> MatMul                      -> two half-width blocks, added
                  (:mod:`aot.export.split_feed_forward`: ONNX Runtime's CPU GEMMs are faster on the halves)
    norm inputs   Add -> LayerNormalization                         -> Sum -> LayerNormalization
                  (:mod:`aot.export.sum_into_layer_norm`: keeps ONNX Runtime from fusing them at load)

Why no skip-LayerNorm fusion on CPU: profiled in ONNX Runtime 1.31 on BERT-base
here, one SkipLayerNormalization took 280-340 us, the Add + LayerNormalization
it replaces 90 us + ~60 us. ONNX Runtime would still fuse them when it loads the
model; feeding the norm from a Sum stops that. On CUDA the fused kernel saves a
round trip through memory, which is what it was written for.

Unknown patterns are left alone: a model without attention or GELU comes out
with only its constants folded.
"""

from __future__ import annotations

import logging
from typing import Literal

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from .onnx_rules import apply_onnx_rules

logger = logging.getLogger(__name__)

Target = Literal["cpu", "cuda"]

# Constant folding only evaluates nodes whose inputs (and outputs) stay below this many elements:
# shape arithmetic folds, weights are never copied.
_FOLD_SIZE_LIMIT = 8192


def fuse_for_ort(model: ir.Model, target: Target = "cpu") -> dict[str, int]:
    """Rewrite ``model`` in place; return ``{fusion: count}`` for every fusion that was tried."""
    from onnxscript.optimizer import fold_constants
    from onnxscript.rewriter.ort_fusions import shape_optimization
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.mha import fuse_mha1, fuse_mha2
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa
    from onnxscript.rewriter.ort_fusions.sdpa_via_mha import replace_sdpa_by_mha
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_layer_normalization

    common_passes.InlinePass()(model)
    _fold(model, fold_constants)
    shape_optimization.rules.apply_to_model(model)
    _fold(model, fold_constants)
    counts = {"erf_gelu": fuse_erfgelu(model)}
    if target == "cuda":
        counts["skip_layer_normalization"] = fuse_skip_layer_normalization(model)
    counts["sdpa"] = fuse_sdpa(model, apply_shape_inference=True)
    counts["multi_head_attention"] = fuse_mha1(model) + fuse_mha2(model)
    counts["sdpa_via_mha"] = replace_sdpa_by_mha(model)
    counts["bias_gelu"] = fuse_bias_gelu(model)
    counts.update(apply_onnx_rules(model, target))
    # The SDPA fusion leaves an onnxscript function behind where no MHA pattern consumed it.
    common_passes.InlinePass()(model)
    common_passes.RemoveUnusedNodesPass()(model)
    common_passes.RemoveUnusedFunctionsPass()(model)
    common_passes.RemoveUnusedOpsetsPass()(model)
    logger.info("ONNX Runtime fusions for %s: %s", target, {name: n for name, n in counts.items() if n})
    return counts


def _fold(model: ir.Model, fold_constants) -> None:
    fold_constants(model, onnx_shape_inference=True, input_size_limit=_FOLD_SIZE_LIMIT, output_size_limit=_FOLD_SIZE_LIMIT)
    common_passes.RemoveUnusedNodesPass()(model)
