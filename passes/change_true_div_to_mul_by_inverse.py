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
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.fx import GraphModule, Node

from .base import ReversibleTransformation
from .registry import register_pass

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


@register_pass("change_true_div_to_mul_by_inverse")
class ChangeTrueDivToMulByInverse(ReversibleTransformation):
    """Changes true divisions by a constant into multiplications by its inverse."""

    preserves_computation = True

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        exact_only: bool = Field(
            default=False,
            description="Only rewrite when 1/c is exact (c a power of two), so outputs stay bit-identical.",
        )

    def transform(self, graph_module: GraphModule) -> GraphModule:
        for node in graph_module.graph.nodes:
            name = _BY_TARGET.get((node.op, node.target)) if node.op in ("call_function", "call_method") else None
            if name is None or self.transformed(node):
                continue
            self.report.matched += 1
            operands = _operands(node)
            if operands is None:
                self.note(f"node '{node.name}': rounding_mode, out= or unexpected arguments")
                continue
            numerator, denominator, keys = operands
            reason = self._reason_to_skip(node, name, numerator, denominator)
            if reason:
                self.note(f"node '{node.name}': {reason}")
                continue
            _, _, new_op, new_target = _DIVISIONS[name]
            node.op, node.target = new_op, new_target
            node.args, node.kwargs = (numerator, 1.0 / denominator), {}
            self.mark_as_transformed(node)
            self.save_reverse_info(node, {"division": name, "denominator": denominator, "keys": keys})
            self.report.changed += 1
        return graph_module

    def _reason_to_skip(self, node: Node, name: str, numerator, denominator) -> str | None:
        if not isinstance(numerator, Node):
            return "the numerator is a constant"
        if isinstance(denominator, bool) or not isinstance(denominator, numbers.Real) or isinstance(denominator, Node):
            return "the denominator is not a constant number"
        if denominator == 0:
            return "the denominator is zero; x / 0 is kept as written"
        if not math.isfinite(denominator):
            return "the denominator is not finite"
        exact = _inverse_is_exact(float(denominator))
        if self.options.exact_only and not exact:
            return f"1/{denominator} is not exact and exact_only is set"
        val = numerator.meta.get("val")
        if name == "operator.truediv" and not isinstance(val, torch.Tensor):
            if val is not None:
                return "the numerator is a Python number (shape arithmetic); kept exact"
            if not exact:
                return f"the numerator's type is unknown and 1/{denominator} is not exact"
        return None

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


def _operands(node: Node):
    """(numerator, denominator, [numerator keyword or None, denominator keyword or None]) or None."""
    kwargs = dict(node.kwargs)
    if kwargs.pop("rounding_mode", None) is not None or "out" in kwargs:
        return None
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
            return None
        values.append(kwargs.pop(name))
        keys.append(name)
    if len(args) > 2 or kwargs:
        return None
    return values[0], values[1], keys


def _inverse_is_exact(denominator: float) -> bool:
    mantissa, exponent = math.frexp(denominator)
    return abs(mantissa) == 0.5 and -1021 <= exponent <= 1022
