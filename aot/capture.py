"""Turn the recipe's trace options into a call of the chosen frontend."""

from __future__ import annotations

import torch

from aot.inputs import dim_ranges, dynamic_axes
from aot.recipe import LoadedRecipe


def capture(loaded: LoadedRecipe, model: torch.nn.Module, example_inputs: dict[str, torch.Tensor]) -> torch.fx.GraphModule:
    """Trace ``model`` with the recipe's frontend; raises :class:`aot.errors.TraceError`."""
    from aot.tracing import export_trace, symbolic_trace

    options = loaded.recipe.trace
    if options.frontend == "export":
        return export_trace(model, example_inputs, dynamic_dims=dynamic_axes(loaded, model), dim_ranges=dim_ranges(loaded, model))
    return symbolic_trace(
        model,
        input_names=list(example_inputs),
        dummy_inputs=example_inputs,
        leaf_modules=tuple(options.leaf_modules),
        autowrap_functions=tuple(options.autowrap_functions),
    )
