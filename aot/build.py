"""``aot build``: recipe → model → inputs → trace → passes → validate → artifacts → manifest.

The library never prints: it logs, reports progress through an optional
callback, and returns a :class:`BuildReport`. Errors are :class:`AotError`
subclasses whose exit codes the CLI maps; the output directory is only
replaced when every stage, artifact validation included, has succeeded.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aot.bundle import DEPLOYMENT_KEY, Deployment, write_deployment_files
from aot.capture import capture
from aot.consent import remember_build
from aot.cuda_graphs import cuda_graph_spec
from aot.compat.torch_private import EXPORT_STACK_MODULES
from aot.compat.window import warn_outside_window
from aot.decoding.generation_check import GenerationCheck
from aot.eager_guard import check_after_each_pass
from aot.errors import ExportError
from aot.imports_beside import imports_beside
from aot.inputs import ShapeCase, check_input_names, dim_ranges, dynamic_axes, onnx_input_names, shape_cases
from aot.manifest import MANIFEST_VERSION, describe_files, hash_files, tool_versions, write_manifest
from aot.memory import MemoryWatch, release_freed_memory, resident_mib
from aot.onnx_stage import OnnxStage
from aot.models import load_model
from aot.outdir import check_replaceable, staged_directory
from aot.pipeline import PassRecord, run_pipeline
from aot.recipe import LoadedRecipe, load_recipe
from aot.stages import Progress, Stages
from aot.accuracy import AccuracyResult, make_gate
from aot.weights_dtype import widen_leftover_linears
from aot.validate import ArtifactChecks, Comparison, eager_outputs, eager_runner, generation_reference, raise_on_failure, validate_graph

log = logging.getLogger(__name__)


@dataclass
class BuildReport:
    name: str
    output: str
    manifest_sha256: str | None = None
    stages: dict[str, float] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    validation: list[Comparison] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    trace: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    peak_rss_by_stage: dict[str, float] = field(default_factory=dict)
    onnx_fusions: dict[str, int] = field(default_factory=dict)
    generation: list[GenerationCheck] = field(default_factory=list)
    deployment: Deployment | None = None
    aoti: dict[str, Any] | None = None  # what export.write_aoti_package records of the AOTInductor package

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation + self.accuracy + self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "output": self.output,
            "ok": self.ok,
            "manifest_sha256": self.manifest_sha256,
            "stages_s": self.stages,
            "passes": [p.to_json() for p in self.passes],
            "onnx_fusions": self.onnx_fusions,
            "validation": [c.to_json() for c in self.validation],
            "accuracy": [a.to_json() for a in self.accuracy],
            "generation": [g.to_json() for g in self.generation],
            "files": self.files,
            "memory": self.memory,
        }


def _stages(report: BuildReport, progress: Progress | None, memory: MemoryWatch) -> Stages:
    """Stages whose times land in the report, with the memory peak noted as each ends."""

    def note_memory(stage: str) -> None:
        report.peak_rss_by_stage[stage] = memory.peak_mib()
        log.debug("%s: resident %.0f MiB, peak %.0f MiB", stage, resident_mib(), report.peak_rss_by_stage[stage])

    stages = Stages(progress, after=note_memory)
    stages.seconds = report.stages
    return stages


def default_output(loaded: LoadedRecipe) -> Path:
    return Path(loaded.recipe.output) if loaded.recipe.output else Path("out") / loaded.name


def build(
    recipe: str | Path | LoadedRecipe, output: str | Path | None = None, progress: Progress | None = None
) -> BuildReport:
    """Build a recipe (a path, or one :func:`aot.recipe.load_recipe` already loaded) into ``output``."""
    started = time.perf_counter()
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    target = Path(output) if output is not None else default_output(loaded)
    check_replaceable(target)  # before any work: aot never deletes what it did not write
    warn_outside_window()
    report = BuildReport(name=loaded.name, output=str(target))
    memory = MemoryWatch()
    try:
        _build(loaded, target, report, _stages(report, progress, memory), memory, started)
    finally:
        memory.stop()
    return report


def _build(
    loaded: LoadedRecipe, target: Path, report: BuildReport, stage: Stages, memory: MemoryWatch, started: float
) -> None:
    """The spine: recipe -> model -> inputs -> trace -> passes -> artifacts, validated -> manifest."""
    recipe = loaded.recipe
    with stage("load_model"):
        model = load_model(loaded, while_weights_load=imports_beside(_modules_needed_next(loaded)))
        check_input_names(loaded, model)
    report.memory["weights_mib"] = round(_tensor_bytes(model) / 2**20, 1)
    with stage("make_inputs"):
        cases = shape_cases(loaded, model)
    with stage("trace"):
        graph_module = capture(loaded, model, cases[0].inputs)
        report.trace = graph_module.meta.get("trace_report", {})
    memory_first = loaded.recipe.model.weights_dtype is not None  # see _eager_reference
    reference = None
    if memory_first:
        with stage("eager_outputs"):
            reference = _eager_reference(loaded, model, cases)
        model.to(device="meta")  # its structure still serves (deployment files, export specs); its weights go
        release_freed_memory()
    with stage("passes"):
        graph_module, report.passes = _run_passes(loaded, graph_module, model)
    if memory_first:  # validated before the export forks: see _eager_reference
        with stage("validate_graph"):
            report.validation, report.accuracy = validate_graph(loaded, graph_module, cases, reference.expected, reference.gate)
        graph_module.to(device=recipe.model.device)  # drops what layers derived at their first call
        release_freed_memory()

    with staged_directory(target) as staging:
        _write(lambda path, text: path.write_text(text, encoding="utf-8"), staging / "recipe.yaml", loaded.text)
        with stage("deployment_files"):
            report.deployment = write_deployment_files(loaded, model, staging)
        onnx_names = onnx_input_names(loaded, model)
        axes, ranges = dynamic_axes(loaded, model), dim_ranges(loaded, model)
        onnx = OnnxStage.start(recipe.export.onnx, graph_module, model, cases, staging / "model.onnx", axes, ranges,
                               on_child=memory.track, input_names=onnx_names)
        try:
            with onnx.beside():
                if reference is None:
                    with stage("eager_outputs"):
                        reference = _eager_reference(loaded, model, cases)
                expected, gate, generation = reference.expected, reference.gate, reference.generation
                del model  # its outputs are the reference; the graph is now its weights' only owner
                release_freed_memory()
                if not memory_first:
                    with stage("validate_graph"):
                        report.validation, report.accuracy = validate_graph(loaded, graph_module, cases, expected, gate)
                if generation is not None:  # module.py then carries generate()
                    graph_module.meta["decoder"] = generation.artifact_meta
                _write_graph_module(loaded, graph_module, staging, report, stage, cases)
                _write_aoti(loaded, graph_module, staging, report, stage, cases[0], axes, ranges)
                hashed_beside_export = hash_files(staging)
                if onnx.in_child:  # the child exports from its own view of the graph: this one goes now, not after
                    graph_module = None
                    release_freed_memory()
        except BaseException:
            onnx.cancel()
            raise
        report.onnx_fusions = onnx.finish(staging / "model.onnx", recipe.model, stage)
        if graph_module is not None:  # exported in process (or not at all)
            graph_module = None  # artifacts are validated from disk, as deployed
            release_freed_memory()
        # The ONNX files are hashed while ONNX Runtime validates them: both wait on other code
        # than Python's (hashlib and onnxruntime release the GIL), so the two overlap.
        checks = ArtifactChecks(loaded, cases, expected, staging, stage, gate, onnx_names)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-hash") as hashing:
            files = hashing.submit(describe_files, staging, hashed_beside_export)
            _add(report, checks.onnx())
            report.files = files.result()
        # module.py runs as hashed: what the manifest lists is what was validated.
        sha256_of = lambda relative: report.files[relative]["sha256"]  # noqa: E731
        _add(report, checks.graph_module(sha256_of))
        _add(report, checks.aoti())
        if generation is not None:
            with stage("validate_generation"):
                report.generation = generation.check_files(staging, sha256_of)
        raise_on_failure(report.validation, report.accuracy + report.generation)
        _note_time_and_memory(report, memory, started)
        manifest_path = _write(write_manifest, staging, _manifest(loaded, report))
        report.manifest_sha256 = hashlib.sha256(manifest_path.read_bytes()).hexdigest()
        remember_build(report.manifest_sha256)  # this machine built it: its code may run here later (aot.consent)


@dataclass
class _EagerReference:
    expected: list[Any]  # eager's outputs for each shape case
    gate: Any  # task metrics on real data, when the recipe asks
    generation: Any  # eager generate's tokens (a GenerationReference), for a decoder step


def _eager_reference(loaded: LoadedRecipe, model: torch.nn.Module, cases: list[ShapeCase]) -> _EagerReference:
    """What the artifacts are validated against, from the eager model.

    Taken beside the ONNX export, after the passes, by default: the passes replace weights
    without writing into the eager model's (``aot.eager_guard``), so nothing is lost by waiting.
    A model that keeps narrow weights (``model.weights_dtype``, meant for models whose size is
    the problem) is taken before the passes instead, and its weights then dropped: the graph is
    their last owner, and each layer a pass replaces frees its float weight at once. Taken after,
    the eager model would hold every weight beside the merged and quantised ones. Its graph is
    then validated before the export forks, and what its layers derived for that at their first
    call (a weight-only layer's int8 codes: 1.1 GB for a 1B model) dropped, so that the export
    child's copy is not counted beside them. The price: the export no longer overlaps the eager
    work or the graph's validation. Measured on the Llama-3.2-1B-shaped int4 recipe: a peak of
    8.0 GB taken after the passes, 3.6 GB taken before them with the export beside the graph's
    validation, and 3.2 GB validated first.
    """
    return _EagerReference(
        expected=[eager_outputs(model, case.inputs) for case in cases],
        gate=make_gate(loaded, eager_runner(model), model),
        generation=generation_reference(loaded, model),
    )


# What the ONNX export (in its forked child, on the critical path) and the artifact checks import
# first: with these imported, the export child imported 0.03 s more where it had imported 0.53 s.
_EXPORT_MODULES = (
    "aot.export",
    *EXPORT_STACK_MODULES,
    "onnxscript.function_libs.torch_lib.ops",
    "onnxscript.optimizer",
    "onnxscript.rewriter.ort_fusions",
    "onnxruntime",
)


def _modules_needed_next(loaded: LoadedRecipe) -> tuple[str, ...]:
    return _EXPORT_MODULES if loaded.recipe.export.onnx.enabled else ()


def _add(report: BuildReport, checked: tuple[list[Comparison], list[AccuracyResult]]) -> None:
    validation, accuracy = checked
    report.validation += validation
    report.accuracy += accuracy


def _run_passes(
    loaded: LoadedRecipe, graph_module: torch.fx.GraphModule, model: torch.nn.Module
) -> tuple[torch.fx.GraphModule, list[PassRecord]]:
    """The recipe's passes, each checked to leave the eager model as it was (its outputs are taken after them)."""
    unchanged_eager_model = check_after_each_pass(model, loaded.passes)
    graph_module, records = run_pipeline(graph_module, loaded.passes, after_each=unchanged_eager_model)
    widened = widen_leftover_linears(graph_module)  # narrow weights (model.weights_dtype) no pass replaced
    if widened:
        graph_module.meta.setdefault("trace_report", {}).setdefault("notes", []).append(
            f"widened {len(widened)} linear layers no pass replaced to {loaded.recipe.model.dtype}")
    return graph_module, records


def _note_time_and_memory(report: BuildReport, memory: MemoryWatch, started: float) -> None:
    report.stages["total"] = round(time.perf_counter() - started, 3)
    figures = report.memory
    figures["start_rss_mib"] = round(memory.start_mib, 1)
    figures["peak_rss_mib"] = memory.peak_mib()
    figures["peak_over_start_mib"] = round(figures["peak_rss_mib"] - memory.start_mib, 1)
    weights = figures["weights_mib"] or 1.0
    figures["peak_per_weights"] = round(figures["peak_rss_mib"] / weights, 2)
    figures["peak_over_start_per_weights"] = round(figures["peak_over_start_mib"] / weights, 2)


def _tensor_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _write_graph_module(
    loaded: LoadedRecipe, graph_module: torch.fx.GraphModule, staging: Path, report: BuildReport, stage: Stages,
    cases: list[ShapeCase],
) -> None:
    from aot import export

    spec = loaded.recipe.export.graph_module
    if not spec.enabled:
        return
    if spec.cuda_graphs:  # module.py then replays its buckets from CUDA graphs (aot.cuda_graphs)
        graph_module.meta["cuda_graphs"] = cuda_graph_spec(spec.cuda_graphs, dynamic_axes(loaded), graph_module, cases,
                                                          loaded.recipe.model.device)
    if loaded.graph_module_passes:
        with stage("graph_module_passes"):
            graph_module, records = run_pipeline(graph_module, loaded.graph_module_passes)
            report.passes += records
    with stage("export_graph_module"):
        export.save_graph_module(graph_module, staging / "graph_module")


def _write_aoti(
    loaded: LoadedRecipe, graph_module: torch.fx.GraphModule, staging: Path, report: BuildReport, stage: Stages,
    case: ShapeCase, axes: dict[str, dict[int, str]], ranges: dict[str, Any],
) -> None:
    from aot import export

    if not loaded.recipe.export.aoti.enabled:
        return
    with stage("export_aoti"):
        report.aoti = export.write_aoti_package(graph_module, case.inputs, axes, ranges, staging / export.AOTI_FILE)


def _manifest(loaded: LoadedRecipe, report: BuildReport) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "name": loaded.name,
        "recipe": {"path": str(loaded.path), "sha256": loaded.sha256, "resolved": loaded.resolved()},
        "versions": tool_versions(),
        "trace": {key: value for key, value in report.trace.items() if key != "duration_s"},
        "passes": [{k: v for k, v in p.to_json().items() if k != "seconds"} for p in report.passes],
        "onnx_fusions": report.onnx_fusions,
        "validation": [c.to_json() for c in report.validation],
        "accuracy": [a.to_json() for a in report.accuracy],
        "generation": [g.to_json() for g in report.generation],
        DEPLOYMENT_KEY: report.deployment.to_json() if report.deployment is not None else None,
        "aoti": report.aoti,
        "artifacts": report.files,
        # Everything that varies from run to run lives under "run", so the rest of the manifest is reproducible.
        "run": {
            "stages_s": report.stages,
            "trace_s": report.trace.get("duration_s"),
            "passes_s": {f"{i + 1}:{p.name}": p.seconds for i, p in enumerate(report.passes)},
            "memory": report.memory,
            "peak_rss_mib_after_stage": report.peak_rss_by_stage,
        },
    }


def _write(writer, path: Path, *args):
    """``writer(path, *args)``, with a full disk or a lost permission reported as an export failure naming the file."""
    try:
        return writer(path, *args)
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror or error}") from None
