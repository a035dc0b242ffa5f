"""Turn the recipe's trace options into a call of the chosen frontend."""

from __future__ import annotations

import torch

from aot.recipe.plan import TracePlan


def capture(
    plan: TracePlan, model: torch.nn.Module, example_inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]],
    ranges: dict[str, tuple[int | None, int | None]],
) -> torch.fx.GraphModule:
    """Trace ``model`` with the recipe's frontend; raises :class:`aot.errors.TraceError`.

    ``axes`` and ``ranges`` (:func:`aot.inputs.dynamic_axes`, :func:`aot.inputs.dim_ranges`) are the
    dims torch.export keeps dynamic; the fx tracer's graph takes any shape.
    """
    from aot.tracing import export_trace, symbolic_trace

    options = plan.spec
    if options.frontend == "export":
        return export_trace(model, example_inputs, dynamic_dims=axes, dim_ranges=ranges)
    return symbolic_trace(
        model,
        input_names=list(example_inputs),
        dummy_inputs=example_inputs,
        leaf_modules=tuple(options.leaf_modules),
        autowrap_functions=tuple(options.autowrap_functions),
    )
