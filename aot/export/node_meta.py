"""Node meta as JSON: what survives a save, and in what form.

Kept: every entry that encodes as JSON data (pass marks are required to be),
plus the scope (``nn_module_stack``). Encoded forms:

- tuple -> ``{"__tuple__": [...]}`` (restored as a tuple);
- a NamedTuple such as ``aot.tracing.Scope`` -> ``{"__namedtuple__": "aot.tracing.scope.Scope",
  "module_path": ..., "module_type": ...}``, restored as that class when it imports, else as a plain tuple;
- a dict whose keys are not all plain strings -> ``{"__dict__": [[key, value], ...]}``;
- ``torch.dtype`` -> ``{"__dtype__": "float32"}``; non-finite float -> ``{"__float__": "nan"}``;
- a class -> its qualified name as a string (``nn_module_stack`` of an fx trace holds
  classes; torch.export already stores strings), so it restores as a string.

Dropped: the fake value (``val``; its shape and dtype are written beside the meta
as ``value``) and entries that differ between two identical builds or carry
objects (stack traces, ``from_node`` with graph ids, autograd ``seq_nr``...),
at any depth wall-clock fields such as ``duration_s`` (the tracer's report has one).
An entry that cannot be encoded is dropped too, with a debug log.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

logger = logging.getLogger(__name__)

NOISE_KEYS = frozenset(
    {
        "val",
        "example_value",
        "tensor_meta",
        "stack_trace",
        "from_node",
        "seq_nr",
        "torch_fn",
        "source_fn_stack",
        "original_aten",
        "grapharg",
        "unbacked_bindings",
        "eager_input_vals",
        "autograd_backward_hook",
    }
)

# Wall-clock measurements differ between two identical builds; they belong in the manifest's timing fields.
TIMING_KEYS = frozenset({"duration_s", "seconds", "elapsed_s", "time_s", "timings_s", "stages_s"})

_MARKERS = ("__tuple__", "__dict__", "__dtype__", "__float__", "__namedtuple__")


class Unencodable(Exception):
    pass


def encode_meta(meta: Mapping[str, Any], node_name: str) -> dict[str, Any]:
    encoded = {}
    for key in sorted(meta):
        if key in NOISE_KEYS or key in TIMING_KEYS:
            continue
        try:
            encoded[key] = encode_value(meta[key])
        except Unencodable as reason:
            logger.debug("node %s: meta[%r] not saved: %s", node_name, key, reason)
    return encoded


def decode_meta(encoded: Mapping[str, Any]) -> dict[str, Any]:
    return {key: decode_value(value) for key, value in encoded.items()}


def encode_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": str(value)}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        fields = {field: encode_value(getattr(value, field)) for field in type(value)._fields}
        return {"__namedtuple__": f"{type(value).__module__}.{type(value).__qualname__}", **fields}
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(item) for item in value]}
    if isinstance(value, list):
        return [encode_value(item) for item in value]
    if isinstance(value, Mapping):
        keys = [key for key in value if key not in TIMING_KEYS]
        if all(type(key) is str and key not in _MARKERS for key in keys):
            return {key: encode_value(value[key]) for key in keys}
        return {"__dict__": [[encode_value(key), encode_value(value[key])] for key in keys]}
    raise Unencodable(f"{type(value).__name__} is not JSON data")


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "__namedtuple__" in value:
        fields = {key: decode_value(item) for key, item in value.items() if key != "__namedtuple__"}
        return _namedtuple(value["__namedtuple__"], fields)
    if len(value) == 1:
        (marker, payload), = value.items()
        if marker == "__tuple__":
            return tuple(decode_value(item) for item in payload)
        if marker == "__dict__":
            return {_hashable(decode_value(key)): decode_value(item) for key, item in payload}
        if marker == "__dtype__":
            return getattr(torch, payload)
        if marker == "__float__":
            return float(payload)
    return {key: decode_value(item) for key, item in value.items()}


def _namedtuple(qualified_name: str, fields: dict[str, Any]) -> Any:
    module_name, _, class_name = qualified_name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
        return cls(**fields)
    except Exception:  # the class is gone or changed: keep the values
        return tuple(fields.values())


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def describe_value(meta: Mapping[str, Any]) -> Any:
    """Shape and dtype of a node's result, from ``val`` (or ``tensor_meta``); symbols as strings."""
    if "val" in meta:
        return _describe(meta["val"])
    if "tensor_meta" in meta:
        return _describe(meta["tensor_meta"])
    return None


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor) or _is_tensor_metadata(value):
        return {"shape": [_dimension(size) for size in value.shape], "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"symbol": str(value)}
    if isinstance(value, (list, tuple)):
        return [_describe(item) for item in value]
    return None


def _is_tensor_metadata(value: Any) -> bool:
    return type(value).__name__ == "TensorMetadata" and hasattr(value, "shape") and hasattr(value, "dtype")


def _dimension(size: Any) -> int | str:
    return size if isinstance(size, int) else str(size)
