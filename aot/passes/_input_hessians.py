"""What GPTQ needs of a layer: ``H = Σ x xᵀ`` over every input row the layer sees when the graph runs on calibration inputs.

The build puts the calibration inputs (keyword dicts, as the graph is called) in
``graph_module.meta[CALIBRATION_KEY]``; :func:`input_hessians` runs the graph on each with a
hook on the layers asked for. A graph run stops as soon as every one of them has seen all its
calls: layers asked for in graph order, a few at a time, cost a part of a forward pass each.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.fx import GraphModule

from .base import CALIBRATION_KEY


class _AllSeen(Exception):
    """Raised inside a graph run once every layer asked for has seen its inputs: the rest of the run is not needed."""


def calibration_inputs(graph_module: GraphModule) -> list[dict[str, torch.Tensor]] | None:
    """The calibration inputs the build gave the graph, or None."""
    return graph_module.meta.get(CALIBRATION_KEY)


def input_hessians(graph_module: GraphModule, calls: dict[str, int]) -> dict[str, torch.Tensor]:
    """``{target: Σ x xᵀ}`` (float32, in x in) for each module in ``calls`` ({target: call sites in the graph})."""
    hessians: dict[str, torch.Tensor] = {}
    pending: Counter[str] = Counter()

    def record(target: str, module: torch.nn.Module, args: tuple) -> None:
        rows = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        if target in hessians:
            hessians[target].addmm_(rows.T, rows)
        else:
            hessians[target] = rows.T @ rows
        pending[target] -= 1
        if not +pending:  # every call of every layer asked for has run
            raise _AllSeen

    handles = [graph_module.get_submodule(target).register_forward_pre_hook(
        lambda module, args, target=target: record(target, module, args)) for target in calls]
    try:
        with torch.no_grad():
            for inputs in graph_module.meta[CALIBRATION_KEY]:
                pending.clear()
                pending.update(calls)
                try:
                    graph_module(**inputs)
                except _AllSeen:
                    pass
    finally:
        for handle in handles:
            handle.remove()
    return hessians
