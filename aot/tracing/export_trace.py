"""``export_trace``: the ``export`` frontend, an ATen-level graph from ``torch.export``.

    gm = export_trace(model, {"input_ids": ids, "attention_mask": mask},
                      dynamic_dims={"input_ids": {0: "batch", 1: "seq"},
                                    "attention_mask": {0: "batch", 1: "seq"}})
    gm(input_ids=..., attention_mask=...)

Dynamic dimensions are named; one name is one ``torch.export.Dim`` shared by
every axis that uses it. ``dim_ranges[name] = "inferred"`` (:data:`INFERRED`) leaves that
dim to torch.export, which expresses it through the others (a decoder's attention mask is
``past + sequence`` long). Ranges: ``dim_ranges[name] = (min, max)`` when given;
otherwise ``min`` is 1 for a name containing "batch" and 2 for any other
(``torch.export`` specialises sizes 0 and 1), and ``max`` is the model's
maximum number of positions for the axes of token inputs (ids, masks), and
unbounded elsewhere. Where the model's code excludes an end of such a default
range (MobileBERT needs ``seq != 2``, GPT-Neo ``seq != max``), that end moves
in by one and the trace report notes it (:mod:`aot.tracing.dim_narrowing`); a
range the caller gave is never changed. Where torch.export's solver cannot prove the
model's guards over a range and asks for a multiple of a stride instead (wav2vec2: samples
``= 10*k``), the dim is exported as ``Dim.DYNAMIC`` with the same bounds, and every guard is
checked at every size of the ranges (:mod:`aot.tracing.export_guards`), since no artifact
re-checks them.

Export is non-strict (``strict=False``): the model's Python runs normally and
only tensor operations are recorded, as ATen ops. The returned module is
``exported_program.module()`` with ``gm.meta["trace_report"]`` (frontend
``"export"``) and ``node.meta["scope"]`` derived from ``nn_module_stack``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.fx

from aot.errors import TraceError, first_line
from aot.process.quiet import quiet_torch

from .dim_narrowing import narrowed_default_range, suggested_ranges, unproven_dim
from .dummy_inputs import forward_parameters
from .export_guards import check_guards_over_ranges
from .model_state import config_use_cache_off, disable_hooked_forward, preserved_model_state, traceable_experts
from .scope import Scope, qualified_type_name
from .source_location import raised_at

logger = logging.getLogger(__name__)

_NARROWING_ATTEMPTS = 4  # each moves one end of one default range past a size the model's code excludes

_TOKEN_INPUT_MARKERS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
_MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_source_positions")


def max_positions(model: torch.nn.Module) -> int | None:
    """The model's position limit (``max_position_embeddings`` and kin); None if its configs name none.

    The smallest over the config and its sub-configs: a dual encoder (CLIP, SigLIP) keeps its
    text tower's limit in ``text_config``, and a token input reaches the tower with the smallest.
    """
    limits = [limit for config in _configs(getattr(model, "config", None)) if (limit := _position_limit(config)) is not None]
    return min(limits) if limits else None


def _position_limit(config: Any) -> int | None:
    for key in _MAX_POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 2:
            return value
    return None


def _configs(config: Any) -> list[Any]:
    """``config`` and its sub-configs (``text_config``, ``vision_config``, ...), depth first."""
    if config is None:
        return []
    found = [config]
    for key in getattr(config, "sub_configs", None) or {}:
        found += _configs(getattr(config, key, None))
    return found


INFERRED = "inferred"  # a dim_ranges value: torch.export works the size out from the other dims


def export_dim(name: str, bounds: tuple[int | None, int | None] | str, unproven: bool = False) -> Any:
    """The ``torch.export`` dim for ``(min, max)`` (either may be None), or ``Dim.AUTO`` for :data:`INFERRED`.

    ``unproven``: a ``Dim.DYNAMIC`` hint with the same bounds, for a dim whose guards torch.export's
    solver cannot prove over the range (:func:`aot.tracing.dim_narrowing.unproven_dim`).
    The export frontend and the ONNX exporter both state their dims through it.
    """
    if bounds == INFERRED:  # e.g. a decoder's mask length, past + sequence, which no named Dim can state
        return torch.export.Dim.AUTO
    low, high = bounds
    limits = {key: value for key, value in (("min", low), ("max", high)) if value is not None}
    return torch.export.Dim.DYNAMIC(**limits) if unproven else torch.export.Dim(name, **limits)


def _build_dims(
    model: torch.nn.Module,
    example_kwargs: Mapping[str, Any],
    dynamic_dims: Mapping[str, Mapping[int, str]],
    dim_ranges: Mapping[str, tuple[int, int] | str] | None,
    unproven: set[str] = frozenset(),
) -> tuple[dict[str, dict[int, Any]], dict[str, list[int | None]]]:
    dim_ranges = dict(dim_ranges or {})
    position_limit = max_positions(model)
    ranges: dict[str, list[int | None]] = {}
    for input_name, axes in dynamic_dims.items():
        if input_name not in example_kwargs:
            raise TraceError(f"dynamic_dims names input '{input_name}', which example_kwargs do not have")
        rank = example_kwargs[input_name].dim()
        for axis, dim_name in axes.items():
            if not -rank <= int(axis) < rank:
                raise TraceError(f"dynamic_dims['{input_name}'] names axis {axis}, but that input has rank {rank}")
            if dim_ranges.get(dim_name) == INFERRED:
                ranges[dim_name] = [None, None]
                continue
            low = 1 if "batch" in dim_name else 2
            given_low, given_high = dim_ranges.get(dim_name, (None, None))
            if given_low is not None or given_high is not None:  # a recipe dim without min and max takes the defaults
                ranges[dim_name] = [low if given_low is None else int(given_low), None if given_high is None else int(given_high)]
                continue
            high = None
            if int(axis) != 0 and position_limit and any(m in input_name for m in _TOKEN_INPUT_MARKERS):
                high = position_limit
            current = ranges.setdefault(dim_name, [low, high])
            if high is not None and (current[1] is None or high < current[1]):
                current[1] = high
    dims = {
        name: export_dim(name, INFERRED if dim_ranges.get(name) == INFERRED else bounds, name in unproven)
        for name, bounds in ranges.items()
    }
    shapes: dict[str, dict[int, Any]] = {}
    for input_name in example_kwargs:
        axes = (dynamic_dims or {}).get(input_name)
        shapes[input_name] = {int(axis): dims[name] for axis, name in axes.items()} if axes else None
    return shapes, ranges


def _scope_of(node: torch.fx.Node, root_scope: Scope) -> Scope:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return root_scope
    path, module_type = list(stack.values())[-1]
    if isinstance(module_type, type):
        module_type = qualified_type_name(module_type)
    path = path.replace("L['self'].", "").replace("L['self']", "")
    return Scope(path, str(module_type))


def _check_unproven_ranges(
    program: torch.export.ExportedProgram,
    dynamic_dims: Mapping[str, Mapping[int, str]],
    ranges: dict[str, list[int | None]],
    unproven: set[str],
    given: Mapping[str, Any],
    notes: list[str],
) -> None:
    """A ``Dim.DYNAMIC`` dim stays dynamic; a range torch.export narrowed is noted, or refused if the caller gave it."""
    values = {node.name: node.meta.get("val") for node in program.graph.find_nodes(op="placeholder")}
    for input_name, axes in dynamic_dims.items():
        for axis, name in axes.items():
            value = values.get(input_name)
            if name not in unproven or not isinstance(value, torch.Tensor):
                continue
            size = value.shape[int(axis)]
            if not isinstance(size, torch.SymInt):
                raise TraceError(f"torch.export specialised dynamic dim '{name}' of input '{input_name}' to {size}")
            bound = program.range_constraints.get(size.node.expr)
            low, high = ranges[name]
            exported = (_as_int(bound.lower), _as_int(bound.upper)) if bound is not None else (low, high)
            if exported == (low, high) or (high is None and exported[0] == low):
                continue
            if any(end is not None for end in given.get(name, (None, None))):
                raise TraceError(f"torch.export narrows dynamic dim '{name}' to {_span(*exported)}, inside the range given ({_span(low, high)})")
            ranges[name] = list(exported)
            notes.append(f"dynamic dim '{name}' narrowed to {_span(*exported)} by torch.export's guards")


def _as_int(bound: Any) -> int | None:
    """A sympy bound of a range as an int; None for infinity (sympy's, or torch's int_oo)."""
    try:
        return int(bound)
    except (TypeError, AttributeError, OverflowError, ValueError):
        return None


def _suggestion(error: BaseException) -> str:
    """The dims' ranges torch.export suggests after refusing the given ones, where it names any."""
    suggested = suggested_ranges(str(error))
    return f" (the model's code holds on {suggested}, as torch.export suggests: give it that range)" if suggested else ""


def _span(low: int | None, high: int | None) -> str:
    return f"{low} to {'no maximum' if high is None else high}"


def _unproven_note(name: str, bounds: list[int | None]) -> str:
    return (
        f"dynamic dim '{name}' ({_span(*bounds)}) is exported as Dim.DYNAMIC: torch.export "
        "could not prove the model's guards over it and asked for a multiple of a stride; the range is kept and the "
        "guards are checked over it"
    )


@contextlib.contextmanager
def _cache_off(model: torch.nn.Module, example_kwargs: Mapping[str, Any], notes: list[str]) -> Iterator[None]:
    """``config.use_cache`` off while exporting, as the fx frontend traces ``use_cache=False``.

    A decoder's forward returns its KV cache object by default, which is no tensor and
    which ``torch.export`` cannot return; the inputs stay as given (a ``use_cache`` keyword
    would become a graph input).
    """
    if "use_cache" in example_kwargs or "use_cache" not in forward_parameters(model):
        yield
        return
    with config_use_cache_off(model) as changed:
        if changed:
            notes.append("traced with use_cache=False")
        yield


def export_trace(
    model: torch.nn.Module,
    example_kwargs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, str]] | None = None,
    dim_ranges: dict[str, tuple[int, int] | str] | None = None,
) -> torch.fx.GraphModule:
    """Export ``model`` called as ``model(**example_kwargs)``; see the module docstring. Raises ``TraceError``."""
    started = time.perf_counter()
    if not isinstance(example_kwargs, Mapping) or not example_kwargs:
        raise TraceError(f"export_trace of {type(model).__name__} needs example_kwargs: a dict of input tensors")
    notes = []
    given = dict(dim_ranges or {})
    with (
        disable_hooked_forward(model),
        preserved_model_state(model) as restored,
        _cache_off(model, example_kwargs, notes),
        traceable_experts(model) as experts_note,
    ):
        if experts_note:
            notes.append(experts_note)
        try:
            unproven: set[str] = set()
            for attempt in range(_NARROWING_ATTEMPTS + 1):
                dynamic_shapes, ranges = _build_dims(model, example_kwargs, dynamic_dims or {}, given, unproven)
                try:
                    # Under no_grad, as the artifacts run: a model's own no_grad blocks (Llama's rotary
                    # embedding) then match the ambient mode and are inlined, not kept as
                    # wrap_with_set_grad_enabled subgraphs, which no artifact can save.
                    with quiet_torch("torch.export"), torch.no_grad():
                        program = torch.export.export(
                            model, (), kwargs=dict(example_kwargs), dynamic_shapes=dynamic_shapes, strict=False
                        )
                    break
                except Exception as error:
                    if attempt == _NARROWING_ATTEMPTS:
                        raise
                    narrowed = narrowed_default_range(str(error), ranges, dim_ranges or {})
                    if narrowed is not None:
                        name, low, high, note = narrowed
                        given[name] = (low, high)
                        notes.append(note)
                        continue
                    name = unproven_dim(str(error), ranges)
                    if name is None or name in unproven:
                        raise
                    unproven.add(name)
                    notes.append(_unproven_note(name, ranges[name]))
        except Exception as error:  # torch.export raises many types; report one line
            location = raised_at(error)
            where = f" at {location}" if location is not None else ""
            raise TraceError(
                f"torch.export failed on {type(model).__name__}{where}: {type(error).__name__}: {first_line(error)[:400]}{_suggestion(error)}"
            ) from error
    if unproven:
        _check_unproven_ranges(program, dynamic_dims or {}, ranges, unproven, dim_ranges or {}, notes)
        guards = getattr(program, "_guards_code", None)
        if guards is None:
            raise TraceError(f"torch.export could not prove its guards over dim(s) {', '.join(sorted(unproven))}, and this torch does not list them")
        checked = check_guards_over_ranges(guards, example_kwargs, dynamic_dims or {}, ranges)
        if checked:
            notes.append(checked)
    gm = program.module()
    root_scope = Scope("", qualified_type_name(model))
    for node in gm.graph.nodes:
        node.meta["scope"] = _scope_of(node, root_scope)
    constants = [
        {"name": name, "shape": list(value.shape), "dtype": str(value.dtype), "device": str(value.device)}
        for name, value in program.constants.items()
        if isinstance(value, torch.Tensor)
    ]
    gm.meta["trace_report"] = {
        "frontend": "export",
        "model": type(model).__name__,
        "input_names": list(example_kwargs),
        "input_shapes": {name: list(value.shape) for name, value in example_kwargs.items()},
        "dynamic_dims": {name: {str(axis): dim for axis, dim in axes.items()} for name, axes in (dynamic_dims or {}).items()},
        "dim_ranges": {name: list(bounds) for name, bounds in ranges.items()},
        "range_constraints": {str(symbol): str(bound) for symbol, bound in program.range_constraints.items()},
        "leaf_modules": [],
        "decisions": [],
        "baked_constants": constants,
        "restored_attributes": restored,
        "notes": notes,
        "num_nodes": len(gm.graph.nodes),
        "duration_s": round(time.perf_counter() - started, 4),
    }
    return gm
