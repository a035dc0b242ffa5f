"""Feed each LayerNormalization from a Sum, not an Add, so ONNX Runtime's CPU session keeps them apart.

Matches (a residual connection, or the embeddings' sum)::

    s = Add(x, residual)
    y = LayerNormalization(s, gamma, beta)

Rewrite to::

    s = Sum(x, residual)
    y = LayerNormalization(s, gamma, beta)

Math: ``Sum`` of two inputs is ``Add``, broadcasting included (both follow numpy's
rules since opset 8): the same result, bit for bit.

Why: whatever a model's file holds, ONNX Runtime rewrites ``Add -> LayerNormalization``
into its ``SkipLayerNormalization`` contrib op when it loads the model, at its default
optimisation level, on every execution provider. On CPU that kernel is the slower
form: profiled on BERT-base here (ONNX Runtime 1.31, 2 threads, 128 tokens) one took
300 us, where a LayerNormalization took 77 us and a Sum 34 us, and the model ran
3-5% faster unfused (interleaved, batch 1 and 8). The fusion matches ``Add`` only, so
a ``Sum`` keeps the two ops apart. On CUDA the fused kernel is the faster one, so the
``cuda`` target does not apply this.

The Sum takes the Add's place, name, output and torch metadata: it is the same fx node's op.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import RULE_NAME_TAG, MatchResult, RewriteRuleClassBase

_FIRST_OPSET_WITH_BROADCASTING_SUM = 8


class SumIntoLayerNorm(RewriteRuleClassBase):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._made: list[ir.Node] = []

    def pattern(self, op, x, residual):
        return op.Add(x, residual, _outputs=["total"])

    def check(self, context, total, **_) -> MatchResult:
        result = MatchResult()
        opset = context.model.opset_imports.get("", 0)
        if opset < _FIRST_OPSET_WITH_BROADCASTING_SUM:
            return result.fail(f"opset {opset}: Sum broadcasts like Add only from opset {_FIRST_OPSET_WITH_BROADCASTING_SUM}")
        if not any(_is_layer_norm_input(node, index) for node, index in total.uses()):
            return result.fail(f"{total.name} is the input X of no LayerNormalization")
        return result

    def rewrite(self, op, x, residual, total, **_):
        sum_ = op.Sum(x, residual, _name=total.producer().name)
        self._made.append(sum_.producer())
        return sum_

    def cleanup(self) -> None:
        # The rewriter stamps its rule name on the nodes a rule makes (before it copies the Add's
        # metadata onto the Sum); the Sum keeps the Add's metadata alone, as in the files aot has
        # always written.
        for node in self._made:
            node.metadata_props.pop(RULE_NAME_TAG, None)


def _is_layer_norm_input(node: ir.Node, index: int) -> bool:
    return node.op_type == "LayerNormalization" and node.domain == "" and index == 0
