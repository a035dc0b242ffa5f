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
import torch.fx


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


def graph_output_names(graph_module: torch.fx.GraphModule) -> list[str] | None:
    """The :func:`flatten_outputs` names of ``graph_module``'s outputs, without running it.

    They are read from the example values (``node.meta["val"]``) that the tracers leave on
    every node. ``None`` where they cannot be: a returned node without one (a pass made it),
    or a graph whose code rebuilds its outputs into another structure (torch.export's pytree
    code generation), whose output node is then not what ``forward`` returns.
    """
    graph = graph_module.graph
    if type(graph._codegen) is not torch.fx.graph.CodeGen:
        return None
    returned = graph.output_node().args[0]
    values = []

    def example_value(node: torch.fx.Node) -> Any:
        values.append(node.meta.get("val"))
        return values[-1]

    structure = torch.fx.node.map_arg(returned, example_value)
    if any(value is None for value in values):
        return None
    try:
        return list(flatten_outputs(structure))
    except TypeError:  # an output that is neither a tensor nor a container of them
        return None
