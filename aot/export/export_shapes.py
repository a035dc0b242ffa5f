"""What ``torch.export`` is given for a traced graph: its example inputs in order, and its dynamic shapes.

Shared by the ONNX export and the compiled package, which both export the same graph.
"""

from __future__ import annotations

import torch
import torch.fx

from aot.errors import ExportError
from aot.tracing.export_trace import export_dim


def ordered_inputs(gm: torch.fx.GraphModule, example_inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The example inputs in the order of the graph's signature, which torch.export requires of kwargs."""
    names = _input_names(gm)
    unknown = sorted(set(example_inputs) - set(names))
    if unknown:
        raise ExportError(f"example input(s) {', '.join(unknown)} are not inputs of the graph ({', '.join(names)})")
    return {name: example_inputs[name] for name in names if name in example_inputs}


def _input_names(gm: torch.fx.GraphModule) -> list[str]:
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is not None:
        return list(info.orig_args)
    return [node.target for node in gm.graph.find_nodes(op="placeholder")]


def dynamic_shapes_of(
    inputs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, str]],
    dim_ranges: dict[str, tuple[int | None, int | None]] | None = None,
    refinable: bool = False,
) -> dict:
    """Dim names as strings (the exporter makes each a ``Dim.DYNAMIC``), or bounded shared Dims.

    ``refinable``: each bounded dim a ``Dim.DYNAMIC`` hint rather than a named ``Dim``, so that
    torch.export narrows a range the model cannot take (a recipe's unbounded sequence against BERT's
    512 positions) instead of refusing it.
    """
    unknown = sorted(set(dynamic_dims) - set(inputs))
    if unknown:
        raise ExportError(f"dynamic dims name input(s) {', '.join(unknown)} that the graph does not take")
    shapes = {}
    for name, tensor in inputs.items():
        axes = dynamic_dims.get(name)
        for axis in axes or {}:
            if not 0 <= axis < tensor.dim():
                raise ExportError(f"dynamic dim '{axes[axis]}' names axis {axis} of input '{name}', which has {tensor.dim()}")
        shapes[name] = {axis: dim_name for axis, dim_name in sorted(axes.items())} if axes else None
    if dim_ranges is None:
        return shapes
    dims = {name: export_dim(name, dim_ranges.get(name, (None, None)), refinable) for name in _dim_names(dynamic_dims)}
    return {name: {axis: dims[dim_name] for axis, dim_name in axes.items()} if axes else None for name, axes in shapes.items()}


def _dim_names(dynamic_dims: dict[str, dict[int, str]]) -> set[str]:
    return {dim_name for axes in dynamic_dims.values() for dim_name in axes.values()}
