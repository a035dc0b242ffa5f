"""One naming of model outputs for eager models, GraphModules and ONNX files.

Hugging Face models return ``ModelOutput`` objects, plain modules return
tensors or tuples. Validation and export compare outputs by name, so every
result is flattened to an ordered ``{name: tensor}`` dict:

- a tensor alone is ``output``;
- a mapping (``ModelOutput`` included) contributes its non-``None`` items by key;
- a tuple or list contributes ``<prefix>.<index>`` (``output_<index>`` at top level).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def flatten_outputs(result: Any) -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}
    _flatten_into(flat, "", result)
    return flat


def _flatten_into(flat: dict[str, torch.Tensor], prefix: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        flat[prefix or "output"] = value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten_into(flat, f"{prefix}.{key}" if prefix else str(key), item)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _flatten_into(flat, f"{prefix}.{index}" if prefix else f"output_{index}", item)
    elif hasattr(value, "to_tuple"):
        _flatten_into(flat, prefix, dict(value.items()))
    else:
        raise TypeError(f"cannot name a model output of type {type(value).__name__} at '{prefix or 'output'}'")
