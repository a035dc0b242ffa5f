"""Default dynamic ranges moved past a size the model's code excludes.

``torch.export`` refuses a range when the model's code holds for all of it but
one size, with a message such as::

    Not all values of seq = L['input_ids'].size()[1] in the specified range seq <= 64
    satisfy the generated guard ((-1) + L['input_ids'].size()[1]) != 1.

When that size is an end of a range ``export_trace`` chose by default (not one
the caller gave), the end moves in by one: here ``seq != 2`` at ``min = 2``
gives ``min = 3``. The guard is solved with sympy (a torch dependency), for one
input size read once.

When the model's code holds only on a narrower interval, ``torch.export`` says which in its
suggested fixes::

    Suggested fixes:
      sequence = Dim('sequence', min=7, max=64)

A suggestion of that plain form (no derived dim such as ``sequence = 10*_sequence``) that
lies inside a default range becomes the range. Either way the trace report names the new
range and why, so a graph that holds for fewer sizes than the defaults never does so
silently.

A suggestion of a derived dim (``sequence = 10*_sequence``) is different: the solver could
not prove a guard over the range, and asks for a divisibility no input has to meet
(wav2vec2's attention guards ``max(1, sequence // 10 - 1) ** 2 > 1``, true for every size
from 30). :func:`unproven_dim` names such a dim; it is then exported as
``Dim.DYNAMIC(min, max)``, under which torch.export keeps the range and turns each guard it
cannot prove into a check of the inputs at run time (``Guard failed: ...``), never a silent
specialisation. Anything else is left to the caller's error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_VIOLATION = re.compile(r"Not all values of (\w+) = [^\n]*?satisfy the generated guard (.+?) != (-?\d+)\.?\s*$", re.MULTILINE)
_SIZE = re.compile(r"L\['[^']+'\]\.size\(\)\[\d+\]")
_SUGGESTION = re.compile(r"^\s*(\w+) = Dim\('\1'(?:, min=(\d+))?(?:, max=(\d+|oo))?\)\s*$", re.MULTILINE)
_DERIVED_SUGGESTION = re.compile(r"^\s*(\w+) = \d+\*_\1\s*$", re.MULTILINE)
_COMPOUND = re.compile(r"!=|==|<|>|\band\b|\bor\b|\bnot\b|[A-Za-z_]{2,}")  # comparisons, logic, names other than s


def narrowed_default_range(
    message: str, ranges: Mapping[str, list[int | None]], given: Mapping[str, tuple[int | None, int | None]]
) -> tuple[str, int, int | None, str] | None:
    """``(dim, min, max, note)`` for the first default range a refusal narrows, or None."""
    return _past_an_excluded_size(message, ranges, given) or _as_suggested(message, ranges, given)


def unproven_dim(message: str, ranges: Mapping[str, list[int | None]]) -> str | None:
    """The dim of a refusal whose suggested fix is a derived dim (``name = K*_name``), or None."""
    for match in _DERIVED_SUGGESTION.finditer(_suggested_fixes(message)):
        if match.group(1) in ranges:
            return match.group(1)
    return None


def suggested_ranges(message: str) -> str:
    """torch.export's plain suggested ranges, as ``"sequence: min 3, max 32"`` (empty if it suggests none)."""
    found = []
    for name, low, high in _suggestions(message):
        bounds = ([f"min {low}"] if low is not None else []) + ([f"max {high}"] if high is not None else [])
        found.append(f"{name}: {', '.join(bounds) or 'unbounded'}")
    return "; ".join(found)


def _suggested_fixes(message: str) -> str:
    """The text after torch.export's "Suggested fixes:" (empty when it has none)."""
    return message.split("Suggested fixes:", 1)[1] if "Suggested fixes:" in message else ""


def _suggestions(message: str) -> list[tuple[str, int | None, int | None]]:
    """``(dim, min, max)`` of each plain suggested range; None where torch.export gives no bound (or ``oo``)."""
    found = []
    for match in _SUGGESTION.finditer(_suggested_fixes(message)):
        name, low, high = match.groups()
        found.append((name, int(low) if low else None, int(high) if high and high != "oo" else None))
    return found


def _as_suggested(
    message: str, ranges: Mapping[str, list[int | None]], given: Mapping[str, tuple[int | None, int | None]]
) -> tuple[str, int, int | None, str] | None:
    """The range torch.export suggests for a default one, when it lies inside it."""
    for name, suggested_low, suggested_high in _suggestions(message):
        if name not in ranges or any(bound is not None for bound in given.get(name, (None, None))):
            continue
        low, high = ranges[name]
        new_low = suggested_low if suggested_low is not None else low
        new_high = suggested_high if suggested_high is not None else high
        inside = new_low >= low and (high is None or (new_high is not None and new_high <= high))
        if inside and (new_low, new_high) != (low, high) and (new_high is None or new_low <= new_high):
            upper = "no maximum" if new_high is None else f"max {new_high}"
            note = f"dynamic dim '{name}' narrowed to min {new_low}, {upper}, as torch.export suggests: the model's code holds only there"
            return name, new_low, new_high, note
    return None


def _past_an_excluded_size(
    message: str, ranges: Mapping[str, list[int | None]], given: Mapping[str, tuple[int | None, int | None]]
) -> tuple[str, int, int | None, str] | None:
    """``(dim, min, max, note)`` after moving a default range's end past the excluded size, or None."""
    for match in _VIOLATION.finditer(message):
        name, guard, value = match.groups()
        if name not in ranges or any(bound is not None for bound in given.get(name, (None, None))):
            continue
        excluded = _excluded_size(guard, int(value))
        low, high = ranges[name]
        if excluded is None:
            continue
        if excluded == low and (high is None or low + 1 <= high):
            return name, low + 1, high, f"dynamic dim '{name}' starts at {low + 1}: the model's code excludes {name} = {low} ({guard} != {value})"
        if high is not None and excluded == high and high - 1 >= low:
            return name, low, high - 1, f"dynamic dim '{name}' ends at {high - 1}: the model's code excludes {name} = {high} ({guard} != {value})"
    return None


def _excluded_size(guard: str, value: int) -> int | None:
    """The one size ``s`` for which ``guard(s) == value``, when the guard reads one input size."""
    import sympy

    if len(set(_SIZE.findall(guard))) != 1:
        return None
    if _COMPOUND.search(_SIZE.sub("s", guard)):
        return None  # one inequality of one size, nothing else: sympify must not read `and`/`or` as Python
    size = sympy.Symbol("s", integer=True)
    try:
        expression = sympy.sympify(_SIZE.sub("s", guard), locals={"s": size})
        solutions = sympy.solve(sympy.Eq(expression, value), size)
    except (sympy.SympifyError, TypeError, ValueError, NotImplementedError):
        return None
    return int(solutions[0]) if len(solutions) == 1 and solutions[0].is_integer else None
