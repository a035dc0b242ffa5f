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
from aot.gates.accuracy import AccuracyResult, Gate
from aot.gates.compare import Comparison, check_artifact, raise_on_failure, run_module, untimed_stage
from aot.inputs import ShapeCase, text_lines
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
    """The ONNX model, the saved GraphModule, then the AOTInductor package, in ``directory``: :class:`ArtifactChecks`."""
    checks = ArtifactChecks(plan, cases, expected, directory, stage or untimed_stage, gate, onnx_names or {})
    results: tuple[list[Comparison], list[AccuracyResult]] = ([], [])
    for checked in (checks.onnx(), checks.graph_module(sha256_of), checks.aoti()):
        results[0].extend(checked[0])
        results[1].extend(checked[1])
    return results


@dataclass
class ArtifactChecks:
    """The files a build wrote in ``directory``, loaded as users load them, against eager.

    Each check is skipped (empty lists) when its file is not there, runs under its stage
    (``validate_onnx``, ``validate_graph_module``, ``validate_aoti``), and with a ``gate`` also scores the
    artifact on the gate's data. The build runs the two apart: it hashes the ONNX files
    while ONNX Runtime checks them.
    """

    plan: ValidationPlan
    cases: list[ShapeCase]
    expected: list[dict[str, Any]]
    directory: Path
    stage: Callable[[str], AbstractContextManager[None]]
    gate: Gate | None = None
    onnx_input_names: dict[str, str] = field(default_factory=dict)  # {case input: ONNX name} where they differ

    def onnx(self) -> tuple[list[Comparison], list[AccuracyResult]]:
        """``model.onnx`` in ONNX Runtime."""
        from aot import export

        onnx_path = self.directory / "model.onnx"
        if not onnx_path.is_file():
            return [], []
        accuracy: list[AccuracyResult] = []
        with self.stage("validate_onnx"):
            tolerances = self.plan.onnx_tolerance
            named = lambda inputs: {self.onnx_input_names.get(name, name): value for name, value in inputs.items()}  # noqa: E731
            run = lambda case: export.run_onnx(onnx_path, named(case.inputs))  # noqa: E731
            results = check_artifact("onnx", run, self.cases, self.expected, tolerances, "model.onnx in onnxruntime", self._gated)
            if self.gate is not None:
                accuracy.append(self.gate.measure("onnx", lambda batch: export.run_onnx(onnx_path, named(batch))))
            export.release_sessions()
        release_freed_memory()
        return results, accuracy

    def graph_module(self, sha256_of: Callable[[str], str | None]) -> tuple[list[Comparison], list[AccuracyResult]]:
        """``graph_module/`` through its own ``module.py`` (``load``, torch alone), the code users run.

        ``sha256_of(relative path)``: the digest ``module.py`` must have when it is executed (its
        text is hashed as it is read, so what runs is what was checked).
        """
        from aot import export

        module_file = "graph_module/module.py"
        if not (self.directory / module_file).is_file():
            return [], []
        accuracy: list[AccuracyResult] = []
        with self.stage("validate_graph_module"):
            # The malloc setting module.py's load makes by default changes no result, only this process's memory.
            saved = export.load_standalone(self.directory / "graph_module", sha256_of(module_file), keep_freed_memory=False)
            saved = saved.to(self.plan.device)
            run = lambda case: run_module(saved, case)  # noqa: E731
            results = check_artifact("graph_module", run, self.cases, self.expected, self.plan.tolerance, f"{module_file} load()", self._gated)
            if self.gate is not None:
                accuracy.append(self.gate.measure("graph_module", lambda batch: saved(**batch)))
            del saved, run
        return results, accuracy

    def aoti(self) -> tuple[list[Comparison], list[AccuracyResult]]:
        """``aoti/model.pt2`` loaded by torch alone in a process of its own: a crash there fails the build, not ends it."""
        from aot import export

        path = self.directory / export.AOTI_FILE
        if not path.is_file():
            return [], []
        accuracy: list[AccuracyResult] = []
        with self.stage("validate_aoti"), export.AotiProcess(path, self.plan.device) as package:
            run = lambda case: package.run(case.inputs)  # noqa: E731
            source = f"{export.AOTI_FILE} in torch._inductor.aoti_load_package, its own process"
            results = check_artifact("aoti", run, self.cases, self.expected, self.plan.tolerance, source, self._gated)
            if self.gate is not None:
                accuracy.append(self.gate.measure("aoti", package.run))
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
    from aot.decoding.fidelity import FidelityReference, metric_thresholds, tokenized_prompts
    from aot.models import load_tokenizer

    fidelity = plan.spec
    prompts = tokenized_prompts(text_lines(plan.prompts_path)[: fidelity.max_prompts], load_tokenizer(plan.tokenizer), fidelity.max_prompt_tokens)
    if not prompts:
        raise plan.locator.error(("generation", "fidelity", "prompts"), "no prompt of two tokens or more")
    thresholds = metric_thresholds(fidelity.model_dump())
    return lambda causal_lm: FidelityReference.take(causal_lm, prompts, fidelity.new_tokens, thresholds)


def saved_graph_module_opener(sha256_of: Callable[[str], str | None]) -> Callable[[Path], torch.nn.Module]:
    """``open(folder)`` of a saved GraphModule whose ``module.py`` must hash as ``sha256_of`` says (for the decoder's
    generation check). The malloc setting ``module.py``'s load makes by default changes no result, only memory."""
    from aot import export

    return lambda folder: export.load_standalone(folder, sha256_of(f"{folder.name}/module.py"), keep_freed_memory=False)

