"""Split each transformer feed-forward block into two halves of its hidden width, for ONNX Runtime on CPU.

Matches (one block; ``x``: [.., H], ``W1``: [H, F], ``W2``: [F, H])::

    h = MatMul(x, W1)
    g = BiasGelu(h, b1)
    y = MatMul(g, W2)

Rewrite to (``A`` = the first F/2 hidden channels, ``B`` = the rest)::

    hA = MatMul(x, W1[:, A])     hB = MatMul(x, W1[:, B])
    gA = BiasGelu(hA, b1[A])     gB = BiasGelu(hB, b1[B])
    yA = MatMul(gA, W2[A, :])    yB = MatMul(gB, W2[B, :])
    y  = Add(yA, yB)

Math: GELU acts on each hidden channel alone, so the hidden channels fall into
independent groups and the second product sums over them:
``gelu(x W1 + b1) W2 = gelu(x W1[:, A] + b1[A]) W2[A, :] + gelu(x W1[:, B] + b1[B]) W2[B, :]``.
The result is the same up to the order of the additions (each half's sum is taken
apart, then the two are added): a few ulp in float32.

Why: ONNX Runtime's CPU GEMMs (MLAS) are markedly slower on BERT's second
feed-forward product (K = 3072, N = 768) than on its halves. Measured here, ONNX
Runtime 1.31, 2 threads, interleaved: the block took 17-19% less time split in two at
1024 rows (batch 8 x 128 tokens), 4-17% less at 128 rows; a split in three was slower
than none. The FLOPs are unchanged.

The halves of ``W2`` are row slices and share the original's memory; the halves of
``W1`` are column slices, views too until the model is written.

Naming: block ``i`` (in graph order) gives nodes ``feed_forward_<i>_part_<p>_{up,gelu,down}``
and ``feed_forward_<i>_sum``, initializers ``feed_forward_<i>_part_<p>.{up.weight,up.bias,down.weight}``;
their output values are named by the graph, as any new value is.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

_MICROSOFT = "com.microsoft"


class SplitFeedForward(RewriteRuleClassBase):
    """One instance per model: it numbers the blocks it splits, and never splits its own halves.

    ``rewrite`` unnames the output it replaces (see there), so the rule runs through the
    rewriter's ``apply_to_model``, never its tracing mode, which calls ``rewrite`` without
    replacing anything: :func:`aot.export.onnx_rules.miss_reasons` only matches.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._blocks_split = 0
        self._made: set[ir.Node] = set()

    def pattern(self, op, x, up_weight, up_bias, down_weight):
        hidden = op.MatMul(x, up_weight)
        activated = op.BiasGelu(hidden, up_bias, _domain=_MICROSOFT)
        return op.MatMul(activated, down_weight, _outputs=["block_output"])

    def check(self, context, up_weight, up_bias, down_weight, block_output, **_) -> MatchResult:
        result = MatchResult()
        # The rewriter goes on to the nodes it has just inserted, and each half is such a block.
        if context.root in self._made:
            return result.fail("this block is a half of one this rule split")
        if isinstance(context.graph_or_function, ir.Function):
            return result.fail("the block is in a function, which cannot hold the halves' weights")
        if block_output.is_graph_output():
            return result.fail(f"the block's output {block_output.name} is a graph output")
        weights = {"up-projection weight": up_weight, "bias": up_bias, "down-projection weight": down_weight}
        for role, value in weights.items():
            if value.const_value is None:
                return result.fail(f"the {role} {value.name} is not a constant")
        up_shape, bias_shape, down_shape = (tuple(value.const_value.shape) for value in weights.values())
        if (len(up_shape), len(bias_shape), len(down_shape)) != (2, 1, 2):
            return result.fail(f"weights of ranks {len(up_shape)}, {len(bias_shape)}, {len(down_shape)}, not 2, 1, 2")
        width = bias_shape[0]
        if up_shape[1] != width or down_shape[0] != width:
            return result.fail(f"weights of shapes {up_shape}, {bias_shape}, {down_shape} disagree on the hidden width")
        if width % 2:
            return result.fail(f"the hidden width {width} is odd: there are no two equal halves")
        return result

    def rewrite(self, op, x, up_weight, up_bias, down_weight, block_output, **_):
        block = f"feed_forward_{self._blocks_split}"
        self._blocks_split += 1
        w1, b1, w2 = (value.const_value.numpy() for value in (up_weight, up_bias, down_weight))
        half = b1.shape[0] // 2
        halves = []
        for part, channels in enumerate((slice(0, half), slice(half, None))):
            name = f"{block}_part_{part}"
            weight_in = op.initializer(ir.Tensor(w1[:, channels], name=f"{name}.up.weight"))
            bias = op.initializer(ir.Tensor(b1[channels], name=f"{name}.up.bias"))
            weight_out = op.initializer(ir.Tensor(w2[channels, :], name=f"{name}.down.weight"))
            product = op.MatMul(x, weight_in, _name=f"{name}_up")
            activated = op.BiasGelu(product, bias, _domain=_MICROSOFT, _name=f"{name}_gelu")
            projected = op.MatMul(activated, weight_out, _name=f"{name}_down")
            self._made.update(value.producer() for value in (product, activated, projected))
            halves.append(projected)
        total = op.Add(*halves, _name=f"{block}_sum")
        self._made.add(total.producer())
        # The rewriter would give the sum the replaced MatMul's output name. The sum is a new value,
        # named by the graph as it is inserted, like the halves' values (and as in the files aot has
        # always written); the replaced value leaves the graph with its MatMul.
        block_output.name = None
        return total

    def cleanup(self) -> None:
        # The rewriter stamps its rule name on the nodes a rule makes and copies the replaced nodes'
        # torch metadata onto them. The halves are new arithmetic, no one fx node's: they carry no
        # metadata, as in the files aot has always written.
        for node in self._made:
            node.metadata_props.clear()
