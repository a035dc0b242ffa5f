"""Outputs against the eager model: one comparison rule, per output, per shape case.

- :func:`eager_outputs`: the reference, called as the tracer calls the model;
- :func:`compare_outputs`: one artifact's outputs against the reference, output by output;
- :func:`check_artifact`: an artifact over every shape case.

An element passes when ``|actual - expected| <= atol + rtol * |expected|``
(numpy's ``allclose`` rule). The relative error reported is
``|actual - expected| / max(|expected|, atol)``. A comparison records, for the worst output, its
max absolute and max relative error, so a failure can say exactly which
tensor drifted and by how much.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from aot.errors import AotError, ValidationError
from aot.gates.accuracy import AccuracyResult
from aot.inputs import ShapeCase
from aot.models import forward_parameters
from aot.recipe.schema import Tolerance, ValidateSpec
from aot.tracing.outputs import flatten_outputs


@dataclass
class OutputError:
    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class Comparison:
    artifact: str
    shape: str
    ok: bool
    outputs: list[OutputError] = field(default_factory=list)
    problem: str | None = None
    atol: float | None = None
    rtol: float | None = None
    source: str | None = None  # what ran: the in-memory graph, module.py as users load it, the ONNX file
    judged_by: str = "atol/rtol"  # or "accuracy gate": the errors are recorded, the gate decides

    @property
    def worst(self) -> OutputError | None:
        failing = [o for o in self.outputs if not o.ok] or self.outputs
        return max(failing, key=lambda o: (not o.ok, o.max_abs), default=None)

    def summary(self) -> str:
        if self.problem:
            return f"{self.artifact} at {self.shape}: {self.problem}"
        worst = self.worst
        if worst is None:
            return f"{self.artifact} at {self.shape}: no outputs"
        within = f" (atol {self.atol:g}, rtol {self.rtol:g})" if self.atol is not None and self.rtol is not None else ""
        return (
            f"{self.artifact} at {self.shape}: output '{worst.name}' shape {tuple(worst.shape)} "
            f"max abs error {worst.max_abs:.3g}, max rel error {worst.max_rel:.3g}{within}"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        worst = self.worst
        data["max_abs"] = max((o.max_abs for o in self.outputs), default=0.0)
        data["max_rel"] = max((o.max_rel for o in self.outputs), default=0.0)
        data["worst_output"] = worst.name if worst else None
        return data


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64 if value.is_floating_point() else value.dtype).numpy()
    return np.asarray(value)


def compare_outputs(
    artifact: str, shape: str, expected: dict[str, Any], actual: dict[str, Any], atol: float, rtol: float
) -> Comparison:
    missing = [name for name in expected if name not in actual]
    if missing:
        return Comparison(artifact, shape, ok=False, problem=f"missing output(s) {', '.join(missing)} (has {', '.join(actual)})", atol=atol, rtol=rtol)
    outputs = []
    for name, expected_value in expected.items():
        want, got = _as_numpy(expected_value), _as_numpy(actual[name])
        if want.shape != got.shape:
            problem = f"output '{name}' has shape {got.shape}, eager {want.shape}"
            return Comparison(artifact, shape, ok=False, outputs=outputs, problem=problem, atol=atol, rtol=rtol)
        if want.size == 0:
            outputs.append(OutputError(name, list(want.shape), 0.0, 0.0, True))
            continue
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        difference = np.abs(got64 - want64)
        finite = np.isfinite(want64) & np.isfinite(got64)
        same_nonfinite = ~finite & ((want64 == got64) | (np.isnan(want64) & np.isnan(got64)))
        difference = np.where(same_nonfinite, 0.0, np.where(finite, difference, np.inf))
        # Relative to the expected magnitude, floored at atol so near-zero elements don't explode it.
        relative = difference / np.maximum(np.abs(want64), max(atol, np.finfo(np.float64).tiny))
        ok = bool(np.all(difference <= atol + rtol * np.abs(np.where(finite, want64, 0.0))))
        outputs.append(OutputError(name, list(want.shape), float(difference.max()), float(relative.max()), ok))
    return Comparison(artifact, shape, ok=all(o.ok for o in outputs), outputs=outputs, atol=atol, rtol=rtol)


def eager_extra_arguments(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """What the eager model is called with beside the inputs, as the tracer calls it: no KV cache, whose objects are no tensors."""
    return {"use_cache": False} if "use_cache" in forward_parameters(model) and "use_cache" not in inputs else {}


def eager_runner(model: torch.nn.Module) -> Callable[[dict[str, Any]], Any]:
    """``run(inputs)`` of the eager model, called as the tracer calls it (see :func:`eager_extra_arguments`)."""
    return lambda inputs: model(**inputs, **eager_extra_arguments(model, inputs))


def eager_outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The eager reference (see :func:`eager_extra_arguments`)."""
    with torch.no_grad():
        return flatten_outputs(model(**inputs, **eager_extra_arguments(model, inputs)))


def run_module(module: Callable[..., Any], case: ShapeCase) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return flatten_outputs(module(**case.inputs))


def check_artifact(
    artifact: str,
    run: Callable[[ShapeCase], dict[str, Any]],
    cases: list[ShapeCase],
    expected: list[dict[str, Any]],
    tolerances: Tolerance | ValidateSpec,
    source: str | None = None,
    gated: bool = False,
) -> list[Comparison]:
    """``run(case)`` at every case against its eager outputs; an artifact that fails to run fails the case.

    ``gated``: the graph's passes change the computation, so an accuracy gate judges it; the errors
    at each shape are recorded, and a case fails only if the artifact does not run or its outputs
    have other names or shapes.
    """
    results = []
    for case, want in zip(cases, expected):
        try:
            got = run(case)
        except AotError:
            raise
        except Exception as error:
            problem = f"failed to run: {type(error).__name__}: {error}"
            results.append(Comparison(artifact, case.label, ok=False, problem=problem, source=source))
            continue
        result = compare_outputs(artifact, case.label, want, got, tolerances.atol, tolerances.rtol)
        result.source = source
        if gated:
            result.ok, result.judged_by = result.problem is None, "accuracy gate"
        results.append(result)
    return results


def raise_on_failure(results: list[Comparison], accuracy: list[AccuracyResult] = (), culprit: str | None = None) -> None:
    failed = [c.summary() for c in results if not c.ok] + [a.summary() for a in accuracy if not a.ok]
    if failed:
        raise ValidationError(failed[0] + (f"; {culprit}" if culprit else ""))


def untimed_stage(name: str) -> AbstractContextManager[None]:
    """A stage that is neither timed nor reported (for ArtifactChecks run where something else times them)."""
    return nullcontext()
