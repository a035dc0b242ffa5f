"""ChangeTrueDivToMulByInverse: multiply by ``1/c`` instead of dividing by a constant ``c``.

Matches any true division of a tensor by a Python number::

    y = x / 8.0                 # operator.truediv
    y = torch.div(x, 8.0)       # also torch.true_divide, torch.divide, x.div(8.0), x.true_divide(8.0)
    y = aten.div.Tensor(x, 8.0) # export frontend, also aten.div.Scalar, aten.divide, aten.true_divide

Rewrites to::

    y = x * 0.125               # operator.mul / torch.mul / x.mul / aten.mul.Tensor

Math: ``x / c = x · (1/c)``; bit-identical when ``1/c`` is exact (``c`` a power of two),
otherwise within one rounding of ``x / c``.

Left alone, with a note: divisions with a ``rounding_mode`` or an ``out=`` tensor, a
zero or non-finite denominator, and divisions whose numerator is a Python number
(shape arithmetic, where ``49 * (1/49)`` would be ``0.999…``); with an unknown
numerator type, only exact inverses are used. ``reverse`` restores the original
operator and denominator exactly (it is saved, not recomputed as ``1/(1/c)``).

Under transformers 5's SDPA attention BERT has no ``truediv`` node left (the attention
scale is an argument of ``scaled_dot_product_attention``; eager attention multiplies by
it), so the pass finds nothing to rewrite there;
Optimum's test expected one (``tests/passes/test_optimum_transformations.py`` keeps it
as an expected failure).
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.fx import GraphModule, Node

from .base import ReversibleTransformation
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten

# name saved in node.meta -> (original op, original target, rewritten op, rewritten target)
_DIVISIONS = {
    "operator.truediv": ("call_function", operator.truediv, "call_function", operator.mul),
    "torch.div": ("call_function", torch.div, "call_function", torch.mul),
    "torch.divide": ("call_function", torch.divide, "call_function", torch.mul),
    "torch.true_divide": ("call_function", torch.true_divide, "call_function", torch.mul),
    "Tensor.div": ("call_method", "div", "call_method", "mul"),
    "Tensor.divide": ("call_method", "divide", "call_method", "mul"),
    "Tensor.true_divide": ("call_method", "true_divide", "call_method", "mul"),
    "aten.div.Tensor": ("call_function", _aten.div.Tensor, "call_function", _aten.mul.Tensor),
    "aten.div.Scalar": ("call_function", _aten.div.Scalar, "call_function", _aten.mul.Scalar),
    "aten.divide.Tensor": ("call_function", _aten.divide.Tensor, "call_function", _aten.mul.Tensor),
    "aten.divide.Scalar": ("call_function", _aten.divide.Scalar, "call_function", _aten.mul.Scalar),
    "aten.true_divide.Tensor": ("call_function", _aten.true_divide.Tensor, "call_function", _aten.mul.Tensor),
    "aten.true_divide.Scalar": ("call_function", _aten.true_divide.Scalar, "call_function", _aten.mul.Scalar),
}
_BY_TARGET = {(op, target): name for name, (op, target, _, _) in _DIVISIONS.items()}
_NUMERATOR_KEYS = ("input", "self")


@dataclass
class _Division:
    node: Node
    name: str  # key of _DIVISIONS
    numerator: Any
    denominator: Any
    keys: list[str | None]  # the keyword each operand was passed by, None when positional


@register_pass("change_true_div_to_mul_by_inverse")
class ChangeTrueDivToMulByInverse(RewriteRule, ReversibleTransformation):
    """Changes true divisions by a constant into multiplications by its inverse."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        exact_only: bool = Field(
            default=False,
            description="Only rewrite when 1/c is exact (c a power of two), so outputs stay bit-identical.",
        )

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        is_division = node.op in ("call_function", "call_method") and (node.op, node.target) in _BY_TARGET
        return is_division and not self.transformed(node)

    def check(self, graph_module: GraphModule, node: Node) -> Match[_Division]:
        division = _division(node)
        return self._check_operands(division.value) if division else division

    def rewrite(self, graph_module: GraphModule, division: _Division) -> None:
        node = division.node
        _, _, new_op, new_target = _DIVISIONS[division.name]
        node.op, node.target = new_op, new_target
        node.args, node.kwargs = (division.numerator, 1.0 / division.denominator), {}
        self.mark_as_transformed(node)
        self.save_reverse_info(node, {"division": division.name, "denominator": division.denominator, "keys": division.keys})

    def _check_operands(self, division: _Division) -> Match[_Division]:
        """Whether multiplying by the inverse of the denominator computes what dividing did."""
        numerator, denominator, node = division.numerator, division.denominator, division.node
        if not isinstance(numerator, Node):
            return Match.fail("the numerator is a constant", node=node)
        if isinstance(denominator, bool) or not isinstance(denominator, numbers.Real) or isinstance(denominator, Node):
            return Match.fail("the denominator is not a constant number", node=node)
        if denominator == 0:
            return Match.fail("the denominator is zero; x / 0 is kept as written", node=node)
        if not math.isfinite(denominator):
            return Match.fail("the denominator is not finite", node=node)
        exact = _inverse_is_exact(float(denominator))
        if self.options.exact_only and not exact:
            return Match.fail(f"1/{denominator} is not exact and exact_only is set", node=node)
        val = numerator.meta.get("val")
        if division.name == "operator.truediv" and not isinstance(val, torch.Tensor):
            if val is not None:
                return Match.fail("the numerator is a Python number (shape arithmetic); kept exact", node=node)
            if not exact:
                return Match.fail(f"the numerator's type is unknown and 1/{denominator} is not exact", node=node)
        return Match.ok(division)

    def reverse(self, graph_module: GraphModule) -> GraphModule:
        for node in self.get_transformed_nodes(graph_module):
            info = self.reverse_info(node)
            op, target, _, _ = _DIVISIONS[info["division"]]
            numerator_key, denominator_key = info["keys"]
            args, kwargs = [], {}
            for key, value in ((numerator_key, node.args[0]), (denominator_key, info["denominator"])):
                if key is None:
                    args.append(value)
                else:
                    kwargs[key] = value
            node.op, node.target, node.args, node.kwargs = op, target, tuple(args), kwargs
            self.mark_as_restored(node)
        return graph_module


def _division(node: Node) -> Match[_Division]:
    """The numerator and denominator of a division node, and the keywords they were passed by."""
    kwargs = dict(node.kwargs)
    unexpected = Match.fail("rounding_mode, out= or unexpected arguments", node=node)
    if kwargs.pop("rounding_mode", None) is not None or "out" in kwargs:
        return unexpected
    args = list(node.args)
    keys: list[str | None] = []
    values = []
    for position, names in ((0, _NUMERATOR_KEYS), (1, ("other",))):
        if len(args) > position:
            values.append(args[position])
            keys.append(None)
            continue
        name = next((key for key in names if key in kwargs), None)
        if name is None:
            return unexpected
        values.append(kwargs.pop(name))
        keys.append(name)
    if len(args) > 2 or kwargs:
        return unexpected
    return Match.ok(_Division(node, _BY_TARGET[(node.op, node.target)], values[0], values[1], keys))


def _inverse_is_exact(denominator: float) -> bool:
    mantissa, exponent = math.frexp(denominator)
    return abs(mantissa) == 0.5 and -1021 <= exponent <= 1022
