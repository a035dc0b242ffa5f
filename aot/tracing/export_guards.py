"""Check torch.export's input guards over every size of the dynamic dims' ranges.

A dim exported as ``Dim.DYNAMIC`` (see :func:`aot.tracing.dim_narrowing.unproven_dim`) keeps
its range, and torch.export lists the conditions on input sizes it could not prove as Python
expressions (``ExportedProgram._guards_code``)::

    max(1, (-1) + (L['input_values'].size()[0] // 10))*max(1, ...) > 1

``module()`` checks them on every call, but a saved artifact does not (aot's saved graph
stands in ``NoGuards`` for torch's guard module, and ONNX has no such check). So the build
checks each one here, at every combination of the sizes it reads, each over its dim's range
(evaluated on integer arrays, all sizes at once). A guard that fails at some size is an error
naming the sizes; a range without a maximum is checked up to :data:`UNBOUNDED_CHECK_LIMIT`,
and the note says so.

The expressions are torch's, but they are parsed and only arithmetic, comparisons and
``max``/``min`` of sizes are evaluated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

import numpy as np

from aot.errors import TraceError

UNBOUNDED_CHECK_LIMIT = 1 << 16  # largest size checked for a dim with no maximum
_MAX_COMBINATIONS = 1 << 21  # sizes evaluated at once for one guard

_SIZE = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")
_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Constant, ast.Load,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)
_FUNCTIONS = {"max": np.maximum, "min": np.minimum}


def check_guards_over_ranges(
    guards: list[str],
    example_kwargs: Mapping[str, object],
    dynamic_dims: Mapping[str, Mapping[int, str]],
    ranges: Mapping[str, list[int | None]],
) -> str | None:
    """Raise ``TraceError`` if a guard fails at some sizes of the ranges; a note when a range was checked only in part."""
    checked_up_to: dict[str, int] = {}
    for guard in dict.fromkeys(guards):  # torch lists some twice
        sizes = sorted(set(_SIZE.findall(guard)))
        expression = _SIZE.sub(lambda match: f"size_{sizes.index((match[1], match[2]))}", guard)
        code = _compiled(expression, guard)
        bounds = [_bounds(input_name, int(axis), example_kwargs, dynamic_dims, ranges) for input_name, axis in sizes]
        open_ended = [index for index, (_, high, _) in enumerate(bounds) if high is None]
        closed = int(np.prod([high - low + 1 for low, high, _ in bounds if high is not None]))
        if closed > _MAX_COMBINATIONS:
            raise TraceError(f"torch.export's guard `{guard}` reads too many sizes to check over the dims' ranges: give them a smaller max")
        limit = min(UNBOUNDED_CHECK_LIMIT, int((_MAX_COMBINATIONS // closed) ** (1 / len(open_ended)))) if open_ended else 0
        values = []
        for low, high, dim in bounds:
            if high is None:
                high = max(low, limit)
                checked_up_to[dim] = min(checked_up_to.get(dim, high), high)
            values.append(np.arange(low, high + 1, dtype=np.int64))
        grid = np.meshgrid(*values, indexing="ij") if values else []
        namespace = {f"size_{index}": array for index, array in enumerate(grid)}
        with np.errstate(divide="ignore", invalid="ignore"):
            holds = np.broadcast_to(np.asarray(eval(code, {"__builtins__": {}, **_FUNCTIONS}, namespace)), grid[0].shape if grid else ())  # noqa: S307 - parsed above
        if not holds.all():
            failing = np.argwhere(~holds)[0]
            where = ", ".join(f"{name}.shape[{axis}] = {values[i][failing[i]]}" for i, (name, axis) in enumerate(sizes))
            raise TraceError(f"the model's code does not hold for every size of the dynamic dims' ranges: torch.export's guard `{guard}` fails at {where}")
    if not checked_up_to:
        return None
    upto = ", ".join(f"'{dim}' up to {size}" for dim, size in sorted(checked_up_to.items()))
    return f"torch.export's guards were checked at every size of the dims' ranges; without a maximum, {upto}"


def _bounds(
    input_name: str, axis: int, example_kwargs: Mapping[str, object], dynamic_dims: Mapping[str, Mapping[int, str]], ranges: Mapping[str, list[int | None]]
) -> tuple[int, int | None, str | None]:
    """``(min, max, dim)`` of one input size: its dim's range, or the example's size for a static axis."""
    dim = {int(key): name for key, name in dynamic_dims.get(input_name, {}).items()}.get(axis)
    if dim is None or dim not in ranges or ranges[dim][0] is None:
        size = int(example_kwargs[input_name].shape[axis])
        return size, size, None
    low, high = ranges[dim]
    return int(low), None if high is None else int(high), dim


def _compiled(expression: str, guard: str):
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise TraceError(f"cannot read torch.export's guard `{guard}`") from None
    for node in ast.walk(tree):
        allowed = isinstance(node, _ALLOWED)
        if isinstance(node, ast.Name):
            allowed = node.id in _FUNCTIONS or node.id.startswith("size_")
        if isinstance(node, ast.Call):
            allowed = isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords
        if isinstance(node, ast.Constant):
            allowed = isinstance(node.value, int)
        if isinstance(node, ast.Compare):
            allowed = len(node.ops) == 1  # a chain is an `and`, which arrays cannot take
        if not allowed:
            raise TraceError(f"cannot check torch.export's guard `{guard}` over the dims' ranges ({type(node).__name__})")
    return compile(tree, "<guard>", "eval")
