"""``aot build``: recipe → model → inputs → trace → passes → validate → artifacts → manifest.

The library never prints: it logs, reports progress through an optional
callback, and returns a :class:`BuildReport`. Errors are :class:`AotError`
subclasses whose exit codes the CLI maps; the output directory is only
replaced when every stage, artifact validation included, has succeeded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aot.capture import capture
from aot.eager_guard import check_after_each_pass
from aot.errors import ExportError
from aot.forked import ForkedStep
from aot.inputs import ShapeCase, check_input_names, dim_ranges, dynamic_axes, shape_cases
from aot.manifest import MANIFEST_VERSION, describe_files, hash_files, tool_versions, write_manifest
from aot.memory import MemoryWatch, resident_mib
from aot.models import load_model
from aot.outdir import check_replaceable, staged_directory
from aot.pipeline import PassRecord, run_pipeline
from aot.recipe import LoadedRecipe, load_recipe
from aot.stages import Progress, Stages
from aot.validate import (
    Comparison,
    eager_outputs,
    raise_on_failure,
    release_freed_memory,
    run_module,
    validate_artifacts,
    validate_graph,
)

log = logging.getLogger(__name__)


@dataclass
class BuildReport:
    name: str
    output: str
    manifest_sha256: str | None = None
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
            "manifest_sha256": self.manifest_sha256,
            "stages_s": self.stages,
            "passes": [p.to_json() for p in self.passes],
            "onnx_fusions": self.onnx_fusions,
            "validation": [c.to_json() for c in self.validation],
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
        _write(lambda path, text: path.write_text(text, encoding="utf-8"), staging / "recipe.yaml", loaded.text)
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
            release_freed_memory()
            with _torch_threads(threads_beside_export), stage("validate_graph"):
                report.validation = validate_graph(loaded, graph_module, cases, expected)
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
        release_freed_memory()
        log.debug("in-memory graph dropped: resident %.0f MiB", resident_mib())
        onnx_options = loaded.recipe.export.onnx
        onnx_path = staging / "model.onnx"
        if onnx_path.is_file() and onnx_options.optimize == "transformer":
            from aot import export

            with stage("optimize_onnx"):  # ONNX Runtime's optimizer works on files: it loads the weights whole
                export.optimize_onnx(
                    onnx_path, onnx_options.optimize, loaded.recipe.model, onnx_options.target, float16=onnx_options.float16
                )
        report.files = describe_files(staging, earlier=hashed_beside_export)
        # module.py runs as hashed: what the manifest lists is what was validated.
        sha256_of = lambda relative: report.files[relative]["sha256"]  # noqa: E731
        report.validation += validate_artifacts(loaded, cases, expected, staging, stage, sha256_of)
        raise_on_failure(report.validation)
        report.stages["total"] = round(time.perf_counter() - started, 3)
        report.memory["start_rss_mib"] = round(memory.start_mib, 1)
        report.memory["peak_rss_mib"] = memory.peak_mib()
        report.memory["peak_over_start_mib"] = round(report.memory["peak_rss_mib"] - memory.start_mib, 1)
        weights = report.memory["weights_mib"] or 1.0
        report.memory["peak_per_weights"] = round(report.memory["peak_rss_mib"] / weights, 2)
        report.memory["peak_over_start_per_weights"] = round(report.memory["peak_over_start_mib"] / weights, 2)
        manifest_path = _write(write_manifest, staging, _manifest(loaded, report))
        report.manifest_sha256 = hashlib.sha256(manifest_path.read_bytes()).hexdigest()


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _tensor_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


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
    output_names = list(run_module(graph_module, smallest))
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
    loaded: LoadedRecipe, graph_module: torch.fx.GraphModule, staging: Path, report: BuildReport, stage: Stages
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


def _write(writer, path: Path, *args):
    """``writer(path, *args)``, with a full disk or a lost permission reported as an export failure naming the file."""
    try:
        return writer(path, *args)
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror or error}") from None
