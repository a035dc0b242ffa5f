"""``aot build``: recipe → model → inputs → trace → passes → validate → artifacts → manifest.

The library never prints: it logs, reports progress through an optional
callback, and returns a :class:`BuildReport`. Errors are :class:`AotError`
subclasses whose exit codes the CLI maps; the output directory is only
replaced when every stage, artifact validation included, has succeeded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aot.capture import capture
from aot.eager_guard import check_after_each_pass
from aot.errors import AotError, ValidationError
from aot.forked import ForkedStep
from aot.inputs import ShapeCase, check_input_names, dim_ranges, dynamic_axes, shape_cases
from aot.manifest import MANIFEST_VERSION, describe_files, hash_files, tool_versions, write_manifest
from aot.memory import MemoryWatch, resident_mib
from aot.models import forward_parameters, load_model
from aot.outdir import staged_directory
from aot.outputs import flatten_outputs
from aot.pipeline import PassRecord, run_pipeline
from aot.recipe import LoadedRecipe, load_recipe
from aot.recipe_schema import Tolerance
from aot.validate import Comparison, compare_outputs

log = logging.getLogger(__name__)

Progress = Callable[[str, str, float | None], None]
"""``progress(stage, event, seconds)``: event is "start" or "done"; seconds is set on "done"."""


@dataclass
class BuildReport:
    name: str
    output: str
    stages: dict[str, float] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    validation: list[Comparison] = field(default_factory=list)
    trace: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    peak_rss_by_stage: dict[str, float] = field(default_factory=dict)
    onnx_fusions: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "output": self.output,
            "ok": self.ok,
            "stages_s": self.stages,
            "passes": [p.to_json() for p in self.passes],
            "onnx_fusions": self.onnx_fusions,
            "validation": [c.to_json() for c in self.validation],
            "files": self.files,
            "memory": self.memory,
        }


class _Stages:
    def __init__(self, report: BuildReport, progress: Progress | None, memory: MemoryWatch):
        self.report, self.progress, self.memory = report, progress, memory

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.progress:
            self.progress(stage, "start", None)
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.report.stages[stage] = round(self.report.stages.get(stage, 0.0) + seconds, 3)
        self.report.peak_rss_by_stage[stage] = self.memory.peak_mib()
        log.debug("%s: resident %.0f MiB, peak %.0f MiB", stage, resident_mib(), self.report.peak_rss_by_stage[stage])
        log.info("%s done in %.2fs", stage, seconds)
        if self.progress:
            self.progress(stage, "done", seconds)


def default_output(loaded: LoadedRecipe) -> Path:
    return Path(loaded.recipe.output) if loaded.recipe.output else Path("out") / loaded.name


def build(recipe_path: str | Path, output: str | Path | None = None, progress: Progress | None = None) -> BuildReport:
    started = time.perf_counter()
    loaded = load_recipe(recipe_path)
    target = Path(output) if output is not None else default_output(loaded)
    report = BuildReport(name=loaded.name, output=str(target))
    memory = MemoryWatch()
    try:
        _build(loaded, target, report, _Stages(report, progress, memory), memory, started)
    finally:
        memory.stop()
    return report


def _build(
    loaded: LoadedRecipe, target: Path, report: BuildReport, stage: _Stages, memory: MemoryWatch, started: float
) -> None:
    with stage("load_model"):
        model = load_model(loaded)
        check_input_names(loaded, model)
    report.memory["weights_mib"] = round(_tensor_bytes(model) / 2**20, 1)
    with stage("make_inputs"):
        cases = shape_cases(loaded, model)
    with stage("trace"):
        graph_module = capture(loaded, model, cases[0].inputs)
        report.trace = graph_module.meta.get("trace_report", {})
    with stage("passes"):
        # The eager reference is computed after the passes, beside the export: they must leave the model as it was.
        unchanged_eager_model = check_after_each_pass(model, loaded.passes)
        graph_module, report.passes = run_pipeline(graph_module, loaded.passes, after_each=unchanged_eager_model)
        del unchanged_eager_model  # it holds the model, which must go as soon as its outputs are taken

    with staged_directory(target) as staging:
        (staging / "recipe.yaml").write_text(loaded.text)
        onnx_export = _start_onnx_export(loaded, graph_module, model, cases, staging, memory)
        # One core is the child's: two threads here would slow the export, the longest stage, more
        # than they speed up what runs beside it.
        threads_beside_export = 1 if onnx_export is not None and not onnx_export.in_process else torch.get_num_threads()
        try:
            with _torch_threads(threads_beside_export), stage("eager_outputs"):
                expected = [eager_outputs(model, case.inputs) for case in cases]
            # The eager model's work is done: its outputs are the reference (a failed validation reloads
            # it to bisect). Without it the graph module is the sole owner of its weights.
            del model
            _release_freed_memory()
            with _torch_threads(threads_beside_export), stage("validate_graph"):
                report.validation = _validate("graph", graph_module, cases, expected, loaded)
                failed = [c for c in report.validation if not c.ok]
                if failed:
                    culprit = _bisect(loaded, cases, expected, failed[0]) if loaded.recipe.validate_.bisect else None
                    raise ValidationError(failed[0].summary() + (f"; {culprit}" if culprit else ""))
            with _torch_threads(threads_beside_export):
                _write_graph_module(loaded, graph_module, staging, report, stage)
            hashed_beside_export = hash_files(staging)
        except BaseException:
            if onnx_export is not None:
                onnx_export.cancel()
            raise
        if onnx_export is not None:
            with stage("export_onnx"):  # the wait for the child, beyond the stages that ran beside it
                report.onnx_fusions = onnx_export.result().fusions
        # Artifacts are validated from disk, as deployed: the in-memory graph is no longer needed.
        del graph_module
        _release_freed_memory()
        log.debug("in-memory graph dropped: resident %.0f MiB", resident_mib())
        onnx_options = loaded.recipe.export.onnx
        onnx_path = staging / "model.onnx"
        if onnx_path.is_file() and onnx_options.optimize == "transformer":
            from aot import export

            with stage("optimize_onnx"):  # ONNX Runtime's optimizer works on files: it loads the weights whole
                export.optimize_onnx(
                    onnx_path, onnx_options.optimize, loaded.recipe.model, onnx_options.target, float16=onnx_options.float16
                )
        report.validation += validate_artifacts(loaded, cases, expected, staging, stage)
        failed = [c for c in report.validation if not c.ok]
        if failed:
            raise ValidationError(failed[0].summary())
        report.files = describe_files(staging, earlier=hashed_beside_export)
        report.stages["total"] = round(time.perf_counter() - started, 3)
        report.memory["start_rss_mib"] = round(memory.start_mib, 1)
        report.memory["peak_rss_mib"] = memory.peak_mib()
        report.memory["peak_over_start_mib"] = round(report.memory["peak_rss_mib"] - memory.start_mib, 1)
        weights = report.memory["weights_mib"] or 1.0
        report.memory["peak_per_weights"] = round(report.memory["peak_rss_mib"] / weights, 2)
        report.memory["peak_over_start_per_weights"] = round(report.memory["peak_over_start_mib"] / weights, 2)
        write_manifest(staging, _manifest(loaded, report))


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    malloc_trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None) if libc_name else None
    if malloc_trim is not None:
        malloc_trim(0)


def _tensor_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def eager_outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The eager reference, called as the tracer calls it: without a KV cache, whose objects are no tensors."""
    extra = {"use_cache": False} if "use_cache" in forward_parameters(model) and "use_cache" not in inputs else {}
    with torch.no_grad():
        return flatten_outputs(model(**inputs, **extra))


def _run_graph(graph_module: torch.nn.Module, case: ShapeCase) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return flatten_outputs(graph_module(**case.inputs))


def _validate(
    artifact: str,
    runnable: Any,
    cases: list[ShapeCase],
    expected: list[dict[str, Any]],
    loaded: LoadedRecipe,
    tolerances: Tolerance | None = None,
) -> list[Comparison]:
    tolerances = tolerances or loaded.recipe.validate_
    results = []
    for case, want in zip(cases, expected):
        try:
            got = runnable(case) if callable(runnable) and not isinstance(runnable, torch.nn.Module) else _run_graph(runnable, case)
        except AotError:
            raise
        except Exception as error:
            results.append(Comparison(artifact, case.label, ok=False, problem=f"failed to run: {type(error).__name__}: {error}"))
            continue
        results.append(compare_outputs(artifact, case.label, want, got, tolerances.atol, tolerances.rtol))
    return results


def _bisect(loaded: LoadedRecipe, cases: list[ShapeCase], expected: list, failure: Comparison) -> str:
    """Re-trace and re-run the pipeline pass by pass to name the first pass after which outputs diverge."""
    with torch.random.fork_rng():  # the same weights again (the recipe's seed or files); the RNG goes on as it was
        model = load_model(loaded)
    index = next(i for i, case in enumerate(cases) if case.label == failure.shape)
    case, want = cases[index], expected[index]
    tolerances = loaded.recipe.validate_
    graph_module = capture(loaded, model, cases[0].inputs)
    if not compare_outputs("trace", case.label, want, _run_graph(graph_module, case), tolerances.atol, tolerances.rtol).ok:
        return "outputs already diverge right after tracing, before any pass"
    culprit: list[str] = []

    def check(step: int, current: torch.fx.GraphModule) -> None:
        if culprit:
            return
        result = compare_outputs("graph", case.label, want, _run_graph(current, case), tolerances.atol, tolerances.rtol)
        if not result.ok:
            culprit.append(f"outputs first diverged after pass '{loaded.passes[step].name}' (step {step + 1}): {result.summary()}")

    run_pipeline(graph_module, loaded.passes, after_each=check)
    return culprit[0] if culprit else "no single pass reproduces the divergence when re-run"


def _start_onnx_export(
    loaded: LoadedRecipe,
    graph_module: torch.fx.GraphModule,
    eager_model: torch.nn.Module,
    cases: list[ShapeCase],
    staging: Path,
    memory: MemoryWatch,
) -> ForkedStep | None:
    """Start writing model.onnx in a child process; None when the recipe wants no ONNX.

    The child exports the graph as the recipe's passes left it while this process takes the
    eager reference outputs, validates the graph and writes the GraphModule artifact (whose own
    passes, e.g. CPU weight prepacking, produce ops ONNX cannot express). What the exporter and
    onnxscript cache (the graph, and through it the weights) goes away with the child.

    The graph's weights are copy-on-write clones of the eager model's. The exporter reads them
    through mutable pointers, which copies a clone unless it is its storage's last owner; so the
    child first drops its own copy of the eager model's weights (this process keeps its model).
    """
    from aot import export

    options = loaded.recipe.export.onnx
    if not options.enabled:
        return None
    # The names do not depend on the shape: the smallest case finds them fastest (two threads here).
    smallest = min(cases, key=lambda case: sum(t.numel() for t in case.inputs.values() if isinstance(t, torch.Tensor)))
    output_names = list(_run_graph(graph_module, smallest))
    parent, eager = os.getpid(), weakref.ref(eager_model)

    def export_onnx() -> Any:
        model = eager()
        if os.getpid() != parent and model is not None:
            model.to(device="meta")
        del model
        return export.write_onnx(
            graph_module,
            staging / "model.onnx",
            cases[0].inputs,
            dynamic_axes(loaded),
            opset=options.opset,
            optimize=options.exporter_optimize,
            external_data=True if options.external_data == "always" else None,
            ort_fusions=options.target if options.optimize == "ort_fusions" else None,
            output_names=output_names,
            dim_ranges=dim_ranges(loaded),
            # The transformer optimizer matches float32 patterns: it converts after its fusions.
            float16=options.float16 and options.optimize != "transformer",
        )

    return ForkedStep("export_onnx", export_onnx, on_child=memory.track)


def _write_graph_module(
    loaded: LoadedRecipe, graph_module: torch.fx.GraphModule, staging: Path, report: BuildReport, stage: _Stages
) -> None:
    from aot import export

    if not loaded.recipe.export.graph_module.enabled:
        return
    if loaded.graph_module_passes:
        with stage("graph_module_passes"):
            graph_module, records = run_pipeline(graph_module, loaded.graph_module_passes)
            report.passes += records
    with stage("export_graph_module"):
        export.save_graph_module(graph_module, staging / "graph_module")


def validate_artifacts(
    loaded: LoadedRecipe,
    cases: list[ShapeCase],
    expected: list[dict[str, Any]],
    directory: Path,
    stage: Callable[[str], AbstractContextManager[None]] | None = None,
) -> list[Comparison]:
    """Compare the ONNX model and the saved GraphModule in ``directory`` with the eager ``expected`` outputs."""
    from aot import export

    stage = stage or (lambda name: nullcontext())
    results: list[Comparison] = []
    onnx_path = directory / "model.onnx"
    if onnx_path.is_file():
        with stage("validate_onnx"):
            onnx_options = loaded.recipe.export.onnx
            tolerances = loaded.recipe.validate_.float16 if onnx_options.float16 else None
            run = lambda case: export.run_onnx(onnx_path, case.inputs)  # noqa: E731
            results += _validate("onnx", run, cases, expected, loaded, tolerances)
            export.release_sessions()
        _release_freed_memory()
    if (directory / "graph_module").is_dir():
        with stage("validate_graph_module"):
            saved = export.load(directory / "graph_module").to(loaded.recipe.model.device)
            results += _validate("graph_module", saved, cases, expected, loaded)
            del saved
    return results


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
