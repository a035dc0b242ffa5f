"""Validation: every artifact against the eager model, at every shape case, in one place.

- :func:`eager_outputs`: the reference, called as the tracer calls the model;
- :func:`compare_outputs`: one artifact's outputs against the reference, output by output;
- :func:`check_artifact`: an artifact over every shape case;
- :func:`bisect`: on a failure, re-run the passes one by one and name the first that diverged;
- an accuracy gate (:mod:`aot.validate.accuracy`), when a pass changes the computation: each artifact is
  scored by task metrics on real data, and :func:`bisect_gate` names the first pass it fails after;
- :class:`ArtifactChecks` (and :func:`validate_artifacts`, both of its checks): the files a build
  writes, loaded as users load them: the ONNX model in ONNX Runtime, the saved GraphModule
  through its own ``module.py`` (``load``, torch alone);
- :func:`validate_directory`: ``aot validate DIR``: the directory's integrity first
  (:mod:`aot.builder.integrity`), then the numerics, with nothing from DIR run before its hash matched.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aot.builder.consent import require_consent
from aot.builder.integrity import verify_directory
from aot.builder.manifest import MANIFEST_NAME
from aot.builder.stages import Progress, Stages
from aot.errors import AotError, IntegrityError, RecipeError, ValidationError
from aot.inputs import ShapeCase, dim_ranges, dynamic_axes, onnx_input_names, shape_cases, text_lines
from aot.models import forward_parameters, load_model
from aot.process.memory import release_freed_memory
from aot.recipe.load import LoadedRecipe, load_recipe
from aot.recipe.plan import BisectPlan, DeploymentPlan, FidelityPlan, GenerationPlan, ValidationPlan, plan_build
from aot.recipe.schema import Tolerance, ValidateSpec
from aot.validate.accuracy import AccuracyResult, Gate, make_gate
from aot.validate.outputs import flatten_outputs


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
    from aot.builder.capture import capture

    with torch.random.fork_rng():  # the same weights again (the recipe's seed or files); the RNG goes on as it was
        model = load_model(plan.model)
    return capture(plan.trace, model, example_inputs, dynamic_axes(plan.inputs, model), dim_ranges(plan.inputs, model))


def _run_passes_again(plan: BisectPlan, graph_module: torch.fx.GraphModule, check: Callable[[int, torch.fx.GraphModule], None]) -> None:
    from aot.builder.pipeline import run_pipeline

    run_pipeline(graph_module, list(plan.passes.passes), after_each=check)


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


def untimed_stage(name: str) -> AbstractContextManager[None]:
    """A stage that is neither timed nor reported (for ArtifactChecks run where something else times them)."""
    return nullcontext()


@dataclass
class DirectoryReport:
    directory: str
    manifest_sha256: str
    files_checked: int = 0
    validation: list[Comparison] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    generation: list[Any] = field(default_factory=list)  # a decoder step's GenerationCheck per artifact and prompt

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation + self.accuracy + self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "manifest_sha256": self.manifest_sha256,
            "files_checked": self.files_checked,
            "validation": [c.to_json() for c in self.validation],
            "accuracy": [a.to_json() for a in self.accuracy],
            "generation": [g.to_json() for g in self.generation],
        }


def validate_directory(
    directory: str | Path,
    recipe_path: str | Path | None = None,
    expect_sha256: str | None = None,
    progress: Progress | None = None,
    trust_code: bool = False,
) -> DirectoryReport:
    """``aot validate DIR``: every file against the manifest, then every artifact against eager.

    Nothing from DIR is imported or run before its hash matched. The recipe is the one given, else
    the one the manifest names if it is still there, else the directory's copy; its sha256 must be
    the manifest's. A recipe's ``model.factory`` is code: see README's "Trust".
    """
    stage = Stages(progress)
    with stage("check_files"):
        integrity = verify_directory(directory, expect_sha256)
        require_consent(Path(directory), integrity.manifest_sha256, expect_sha256, trust_code, "aot validate")
    directory = Path(directory)
    plan = plan_build(recipe_of_build(directory, integrity.manifest, recipe_path))
    with stage("check_tokenizer"):
        check_deployment_preprocessing(plan.deployment, directory, integrity.manifest)
    with stage("load_model"):
        model = load_model(plan.model)
        cases = shape_cases(plan.inputs, model)
        onnx_names = onnx_input_names(plan.inputs, model)
    with stage("eager_outputs"):
        expected = [eager_outputs(model, case.inputs) for case in cases]
        gate = make_gate(plan.validation.gate, eager_runner(model), model)
        generation = generation_reference(plan.validation.generation, model)
    del model
    release_freed_memory()
    report = DirectoryReport(str(directory), integrity.manifest_sha256, integrity.files_checked)
    report.validation, report.accuracy = validate_artifacts(
        plan.validation, cases, expected, directory, stage, integrity.sha256_of, gate, onnx_names
    )
    if generation is not None:
        with stage("validate_generation"):
            report.generation = generation.check_files(directory, integrity.sha256_of)
    raise_on_failure(report.validation, report.accuracy + report.generation)
    return report


def check_deployment_preprocessing(plan: DeploymentPlan, directory: Path, manifest: dict) -> None:
    """The tokenizer the directory ships encodes the build's texts as the recipe's own tokenizer does, and its image
    processor gives pixels of the shape the build takes (exit 5 if not)."""
    from aot.bundle import DEPLOYMENT_KEY, check_shipped_processor, check_shipped_tokenizer, takes_pixels
    from aot.models import load_tokenizer

    deployment = manifest.get(DEPLOYMENT_KEY) or {}
    if deployment.get("processor") and takes_pixels(plan):
        check_shipped_processor(plan, directory)
    if not deployment.get("tokenizer") or plan.tokenizer is None:
        return
    check_shipped_tokenizer(plan, directory, load_tokenizer(plan.tokenizer))


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


def recipe_of_build(directory: Path, manifest: dict[str, Any], recipe_path: str | Path | None = None) -> LoadedRecipe:
    """The recipe a checked build directory was built from (see :func:`validate_directory`)."""
    recorded = manifest["recipe"]
    source = Path(recipe_path) if recipe_path else Path(str(recorded.get("path", "")))
    copy = not recipe_path and not source.is_file()
    if copy:
        source = directory / "recipe.yaml"  # the copy the build kept; its hash was checked with the rest
    if not source.is_file():
        raise RecipeError(f"{source}: recipe not found; pass --recipe")
    try:
        loaded = load_recipe(source)
    except RecipeError as error:
        if not copy:
            raise
        # The copy's relative paths (model.pretrained, the gate's data) now start from the build directory.
        raise RecipeError(f"{error} (the build's copy of its recipe, read since {recorded.get('path')} is not there "
                          "from here: pass --recipe with the recipe itself)") from None
    if loaded.sha256 != recorded["sha256"]:
        raise IntegrityError(f"{source}: recipe changed since the build (sha256 differs from {MANIFEST_NAME})")
    return loaded
