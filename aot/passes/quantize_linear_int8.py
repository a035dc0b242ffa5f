"""QuantizeLinearInt8: linear layers with int8 weights and dynamically quantised int8 activations.

Matches (``fx`` frontend) every float32 ``nn.Linear`` call whose path no ``skip``
pattern names::

    h = self.encoder.layer.0.intermediate.dense(x)     # nn.Linear(768, 3072), float32

Rewrites to::

    h = self.encoder.layer.0.intermediate.dense(x)     # aot.runtime.Int8DynamicLinear(768, 3072, bias=True,
                                                        #     activations="per_tensor", engine="onednn")

The new module holds ``weight`` as int8 ``q`` ``(out, in)``, ``weight_scale`` as float32
``s`` ``(out,)`` and the float ``bias``, all plain tensors (``weights.safetensors`` keeps
its keys; the weight takes a quarter of the bytes).

Math. Weights, symmetric, per output channel ``c`` (or one ``s`` for the whole tensor
with ``per_channel: false``)::

    s_c = max_k |W_ck| / 127        q_ck = clamp(round(W_ck / s_c), -127, 127)

Activations, per call. ``activations: per_tensor`` (the default): one asymmetric uint8
grid for the whole tensor, with zero exactly representable (ONNX ``DynamicQuantizeLinear``)::

    a = (max(x, 0) - min(x, 0)) / 255      z = round(-min(x, 0) / a)      x_q = clamp(round(x / a) + z, 0, 255)
    y = a · ((x_q - z) @ q^T) · s + b

``activations: per_token``: one symmetric int8 step per row (token)::

    a_r = max_k |x_rk| / 127      x_q = clamp(round(x / a_r), -127, 127)      y_r = a_r · (x_q @ q^T)_r · s + b

Per tensor, one token with a large value coarsens every token's grid. On the real
all-MiniLM-L6-v2 and 279 sentences (``recipes/minilm_int8.yaml``), mean-pooled embeddings
against float32: per tensor, cosine mean 0.9926 / min 0.967, Spearman 0.990; per token,
0.997 / 0.983 / 0.996; int8 weights alone, 0.9996 / 0.996 / 0.9995.

Each weight moves by at most ``s_c / 2`` and each activation by at most ``a / 2``, so
this pass does not preserve the computation: a recipe using it must name an accuracy
gate (``validate.accuracy``). The saved GraphModule runs torch's own int8 GEMMs: per
tensor ``torch.ops.quantized.linear_dynamic`` (oneDNN or FBGEMM, the ``engine`` option),
per token ``torch._int_mm``. The ONNX model carries the same int8 weights and scales
(:mod:`aot.export.onnx_int8`): per tensor ``DynamicQuantizeLinear`` + ``MatMulInteger``,
which ONNX Runtime fuses into its int8 kernel; per token ``Abs``/``ReduceMax``/``Round``
+ ``MatMulInteger``.

Left alone, with a note: layers named by ``skip`` (``fnmatch`` patterns on the module
path, e.g. ``"*.pooler.*"`` or ``"classifier"``), subclasses of ``nn.Linear`` and layers
with hooks, layers that do not compute in float32 (an ``UpcastLinear``'s narrow weight, widened
where used, does) or are not on the CPU, and calls with unusual
arguments. A layer called at several sites is converted once and serves them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from torch.fx import GraphModule

from aot.runtime.int8_linear import Int8DynamicLinear

from ._modules import set_submodule
from ._quantizable_linears import LinearLayer, linear_layers, quantizable_miss
from .registry import register_pass
from .rule import Match, RewriteRule


@register_pass("quantize_linear_int8", frontends=("fx",))
class QuantizeLinearInt8(RewriteRule):
    """Runs nn.Linear layers with int8 weights and per-call int8 activations (not computation-preserving)."""

    preserves_computation = False

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        skip: list[str] = Field(
            default=[],  # pydantic copies it per instance; a literal default is what `aot passes` prints
            description="fnmatch patterns on module paths (e.g. '*.pooler.*', 'classifier') of linear layers to keep in float32.",
        )
        per_channel: bool = Field(default=True, description="One weight scale per output channel (true) or one for the whole weight (false).")
        activations: Literal["per_tensor", "per_token"] = Field(
            default="per_tensor",
            description="Activation scales computed per call: one for the whole tensor (uint8, as ONNX Runtime's "
            "quantize_dynamic), or one per token (int8, symmetric), which keeps a token's outliers from coarsening the others.",
        )
        engine: Literal["onednn", "fbgemm"] = Field(
            default="onednn",
            description="torch's int8 GEMM family for the saved GraphModule on CPU with per-tensor activations (per token runs "
            "torch._int_mm); the ONNX model is unaffected.",
        )

    def candidates(self, graph_module: GraphModule) -> Iterator[Match[LinearLayer]]:
        """Each nn.Linear with all its call sites: one module, quantised once."""
        return linear_layers(graph_module)

    def check(self, graph_module: GraphModule, layer: LinearLayer) -> Match[LinearLayer]:
        miss = quantizable_miss(graph_module, layer, self.options.skip, "int8 quantisation")
        return Match.fail(miss) if miss else Match.ok(layer)

    def rewrite(self, graph_module: GraphModule, layer: LinearLayer) -> None:
        target, nodes = layer
        linear = graph_module.get_submodule(target)
        set_submodule(graph_module, target, Int8DynamicLinear.from_linear(
            linear, self.options.per_channel, self.options.activations, self.options.engine
        ))
        for node in nodes:
            self.mark_as_transformed(node)
