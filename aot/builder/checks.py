"""A build's checks: the traced graph in memory, then each artifact's files as users load them, against eager.

- :func:`validate_graph`: the graph after the passes; on failure, bisection (:mod:`aot.builder.bisect`) names the pass;
- :class:`ArtifactChecks` (and :func:`validate_artifacts`, all of its checks): the files a build writes, each
  checked by its artifact kind (:mod:`aot.export.kinds`);
- an accuracy gate (:mod:`aot.gates.accuracy`), when a pass changes the computation: each artifact is scored by task
  metrics on real data; a decoder's generations against eager's (:mod:`aot.decoding.generation_check`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aot.builder.bisect import bisect, bisect_gate
from aot.export.kinds import ArtifactKind, OpenOptions, artifact_kind, in_check_order
from aot.gates.accuracy import AccuracyResult, Gate
from aot.gates.compare import Comparison, check_artifact, raise_on_failure, run_module, untimed_stage
from aot.inputs import ShapeCase
from aot.process.memory import release_freed_memory
from aot.recipe.plan import FidelityPlan, GenerationPlan, ValidationPlan


def judged_by_a_gate(plan: ValidationPlan, gate: Gate | None) -> bool:
    """Whether the passes change the computation and a gate judges the artifacts instead of atol/rtol: the accuracy
    gate (``gate``), or a decoder's fidelity gate (``generation.fidelity``), which judges the generations."""
    return (gate is not None or plan.fidelity is not None) and plan.changes_computation


def validate_graph(
    plan: ValidationPlan,
    graph_module: torch.fx.GraphModule,
    cases: list[ShapeCase],
    expected: list[dict[str, Any]],
    gate: Gate | None = None,
) -> tuple[list[Comparison], list[AccuracyResult]]:
    """The traced graph after the passes, in memory; on failure, bisect (when the recipe asks) and raise."""
    run = lambda case: run_module(graph_module, case)  # noqa: E731
    gated = judged_by_a_gate(plan, gate)
    results = check_artifact("graph", run, cases, expected, plan.tolerance, "traced graph after the passes", gated)
    accuracy = [gate.measure("graph", lambda batch: graph_module(**batch))] if gate is not None else []
    failed = [c for c in results if not c.ok]
    if failed or not all(a.ok for a in accuracy):
        culprit = None
        if plan.bisect is not None:
            culprit = (bisect(plan.bisect, cases, expected, failed[0], plan.tolerance) if failed
                       else bisect_gate(plan.bisect, cases[0].inputs, gate))
        raise_on_failure(results, accuracy, culprit)
    return results, accuracy


def validate_artifacts(
    plan: ValidationPlan,
    cases: list[ShapeCase],
    expected: list[dict[str, Any]],
    directory: Path,
    stage: Callable[[str], AbstractContextManager[None]] | None = None,
    sha256_of: Callable[[str], str | None] = lambda relative: None,
    gate: Gate | None = None,
    onnx_names: dict[str, str] | None = None,
) -> tuple[list[Comparison], list[AccuracyResult]]:
    """Every artifact kind's files in ``directory``, in the order a build checks them: :class:`ArtifactChecks`."""
    checks = ArtifactChecks(plan, cases, expected, directory, stage or untimed_stage, gate, onnx_names or {})
    results: tuple[list[Comparison], list[AccuracyResult]] = ([], [])
    for kind in in_check_order():
        checked = checks.check(kind, sha256_of)
        results[0].extend(checked[0])
        results[1].extend(checked[1])
    return results


@dataclass
class ArtifactChecks:
    """The files a build wrote in ``directory``, loaded as users load them, against eager.

    Each kind's check is skipped (empty lists) when its file is not there, runs under its stage
    (``validate_<kind>``), and with a ``gate`` also scores the artifact on the gate's data. The build runs them
    apart: it hashes the ONNX files while ONNX Runtime checks them.
    """

    plan: ValidationPlan
    cases: list[ShapeCase]
    expected: list[dict[str, Any]]
    directory: Path
    stage: Callable[[str], AbstractContextManager[None]]
    gate: Gate | None = None
    onnx_input_names: dict[str, str] = field(default_factory=dict)  # {case input: ONNX name} where they differ

    def check(self, kind: ArtifactKind, sha256_of: Callable[[str], str | None] = lambda relative: None
              ) -> tuple[list[Comparison], list[AccuracyResult]]:
        """``kind``'s files through its own loader (``checked_runner``) at every shape case, and on the gate's data.

        ``sha256_of(relative path)``: the digest code must have when it is executed (``module.py``'s text is
        hashed as it is read, so what runs is what was checked).
        """
        if not (self.directory / kind.main_file).is_file():
            return [], []
        accuracy: list[AccuracyResult] = []
        options = OpenOptions(manifest={}, sha256_of=sha256_of, device=str(self.plan.device))
        with self.stage(f"validate_{kind.name}"), kind.checked_runner(self.directory, options, self.onnx_input_names) as opened:
            run, run_batch, source = opened
            results = check_artifact(kind.name, lambda case: run(case.inputs), self.cases, self.expected,
                                     getattr(self.plan, kind.tolerance), source, self._gated)
            if self.gate is not None:
                accuracy.append(self.gate.measure(kind.name, run_batch))
            del run, run_batch, opened
        release_freed_memory()
        return results, accuracy

    @property
    def _gated(self) -> bool:
        return judged_by_a_gate(self.plan, self.gate)


def generation_reference(plan: GenerationPlan | None, model: torch.nn.Module):
    """Eager generate's tokens on the recipe's prompts, for a decoder step (``generation.cache``); else None."""
    if plan is None:
        return None
    from aot.decoding.generation_check import GenerationReference

    spec, tolerance = plan.spec, plan.tolerance
    return GenerationReference.take(model, spec.prompt_lengths, spec.new_tokens, plan.seed, tolerance.atol, tolerance.rtol,
                                    fidelity_reference(plan.fidelity))


def fidelity_reference(plan: FidelityPlan | None) -> Callable[[torch.nn.Module], Any] | None:
    """What takes the fidelity gate's eager reference from a causal LM (``generation.fidelity``); None without a gate."""
    if plan is None:
        return None
    from aot.builder.prompts import fidelity_prompts
    from aot.decoding.fidelity import FidelityReference, metric_thresholds

    fidelity = plan.spec
    prompts = fidelity_prompts(plan)
    thresholds = metric_thresholds(fidelity.model_dump())
    return lambda causal_lm: FidelityReference.take(causal_lm, prompts, fidelity.new_tokens, thresholds)


def saved_graph_module_opener(sha256_of: Callable[[str], str | None]) -> Callable[[Path], torch.nn.Module]:
    """``open(folder)`` of a saved GraphModule whose ``module.py`` must hash as ``sha256_of`` says (for the decoder's
    generation check): the GraphModule kind's own loader. The malloc setting ``module.py``'s load makes by default
    changes no result, only memory."""
    graph_module = artifact_kind("graph_module")
    return lambda folder: graph_module.open_module(folder.parent, sha256_of, keep_freed_memory=False)
