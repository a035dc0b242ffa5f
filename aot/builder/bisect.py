"""On a failed validation, name the pass at fault: re-trace, re-run the passes one by one, check after each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aot.builder.capture import capture
from aot.builder.pipeline import run_pipeline
from aot.gates.accuracy import Gate
from aot.gates.compare import Comparison, compare_outputs, run_module
from aot.inputs import ShapeCase, dim_ranges, dynamic_axes
from aot.models import load_model
from aot.recipe.plan import BisectPlan
from aot.recipe.schema import Tolerance


def bisect(plan: BisectPlan, cases: list[ShapeCase], expected: list, failure: Comparison, tolerance: Tolerance) -> str:
    """Re-trace and re-run the pipeline pass by pass to name the first pass after which outputs diverge."""
    index = next(i for i, case in enumerate(cases) if case.label == failure.shape)
    case, want = cases[index], expected[index]
    graph_module = _retrace(plan, cases[0].inputs)
    if not compare_outputs("trace", case.label, want, run_module(graph_module, case), tolerance.atol, tolerance.rtol).ok:
        return "outputs already diverge right after tracing, before any pass"
    culprit: list[str] = []

    def check(step: int, current: torch.fx.GraphModule) -> None:
        if culprit:
            return
        result = compare_outputs("graph", case.label, want, run_module(current, case), tolerance.atol, tolerance.rtol)
        if not result.ok:
            culprit.append(f"outputs first diverged after pass '{plan.passes.passes[step].name}' (step {step + 1}): {result.summary()}")

    _run_passes_again(plan, graph_module, check)
    return culprit[0] if culprit else "no single pass reproduces the divergence when re-run"


def bisect_gate(plan: BisectPlan, first_inputs: dict[str, Any], gate: Gate) -> str:
    """Re-trace and re-run the pipeline pass by pass to name the first pass after which the gate fails."""
    graph_module = _retrace(plan, first_inputs)
    culprit: list[str] = []

    def check(step: int, current: torch.fx.GraphModule) -> None:
        if not culprit:
            result = gate.measure("graph", lambda batch: current(**batch))
            if not result.ok:
                culprit.append(f"the gate first failed after pass '{plan.passes.passes[step].name}' (step {step + 1})")

    _run_passes_again(plan, graph_module, check)
    return culprit[0] if culprit else "no single pass reproduces the failure when re-run"


def _retrace(plan: BisectPlan, example_inputs: dict[str, Any]) -> torch.fx.GraphModule:
    """The model loaded and traced again, as the build did."""
    with torch.random.fork_rng():  # the same weights again (the recipe's seed or files); the RNG goes on as it was
        model = load_model(plan.model)
    return capture(plan.trace, model, example_inputs, dynamic_axes(plan.inputs, model), dim_ranges(plan.inputs, model))


def _run_passes_again(plan: BisectPlan, graph_module: torch.fx.GraphModule, check: Callable[[int, torch.fx.GraphModule], None]) -> None:
    run_pipeline(graph_module, list(plan.passes.passes), after_each=check)
