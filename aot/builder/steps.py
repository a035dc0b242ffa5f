"""The build's stages, each a function of its section of the plan and of what earlier stages made.

Each stage reads what it needs from :class:`Work` and writes what it makes there, or into the
:class:`~aot.builder.report.BuildReport`, and declares both (:func:`declares`, in terms of :class:`Data`). None
decides when it runs, what runs beside it, or when memory is freed: :class:`aot.builder.schedule.BuildSchedule`
does, from those declarations alone. What a stage adds to the report is its own record, which only the manifest
reads, at the end: declarations name what the stages hand each other.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from aot.builder.capture import capture
from aot.directory.manifest import MANIFEST_VERSION, tool_versions, write_manifest
from aot.builder.pipeline import run_pipeline
from aot.builder.report import BuildReport
from aot.bundle import DEPLOYMENT_KEY, write_deployment_files
from aot.cuda_graphs import cuda_graph_spec
from aot.errors import ExportError
from aot.inputs import ShapeCase, check_input_names, dim_ranges, dynamic_axes, onnx_input_names, shape_cases
from aot.models import load_model
from aot.passes.base import CALIBRATION_KEY, FIDELITY_TARGET_KEY
from aot.recipe.plan import BuildPlan, CalibrationPlan, DeploymentPlan, ExportPlan, InputsPlan, ModelPlan, PassesPlan, TracePlan, ValidationPlan
from aot.recipe.schema import OnnxSpec
from aot.gates.accuracy import make_gate
from aot.builder.checks import ArtifactChecks, generation_reference, saved_graph_module_opener, validate_graph
from aot.builder.onnx_stage import OnnxStage
from aot.builder.prompts import calibration_prompts
from aot.export.kinds import ArtifactKind, WriteContext, artifact_kinds, enabled_kinds
from aot.gates.compare import eager_outputs, eager_runner, raise_on_failure, untimed_stage
from aot.gates.eager_guard import check_after_each_pass
from aot.weights_dtype import widen_leftover_linears

log = logging.getLogger(__name__)


class Data(enum.Enum):
    """What the stages hand each other (:class:`Work`'s fields, the staged files), as they declare it."""

    MODEL_WEIGHTS = "the eager model's weights"
    MODEL_STRUCTURE = "the eager model's modules and config: what still serves once its weights are on the meta device"
    INPUTS = "the shape cases, the dims kept dynamic and their ranges, the ONNX input names"
    GRAPH = "the traced graph, with its weights: clones of the eager model's, then what the passes made"
    GRAPH_DERIVED = "what the graph's layers derive when it runs (a weight-only layer's int8 codes): a cache"
    KIND_GRAPHS = "the graphs lowered for one artifact kind alone (export.<kind>.passes)"
    REFERENCE = "eager's outputs at every shape case, the gate's reference, a decoder's generations"
    GRAPH_CHECK = "the graph's outputs held to the reference"
    ONNX_EXPORT = "the ONNX export under way: a forked child, or prepared to run in process"
    FILES = "the files written into the staging directory"
    FILE_CHECKERS = "the artifacts' checks, holding the reference"
    FILE_CHECKS = "the artifacts' outputs held to the reference"


WEIGHTS = frozenset({Data.MODEL_WEIGHTS, Data.GRAPH})
"""A stage that reads one of these runs a model."""
CACHES = frozenset({Data.GRAPH_DERIVED})
"""What nothing reads: made by running the graph, rebuilt when it runs again."""

Step = TypeVar("Step", bound=Callable[..., Any])


def declares(*, reads: Iterable[Data] = (), writes: Iterable[Data] = ()) -> Callable[[Step], Step]:
    """Store on a step what it reads and what it writes (``step.reads``, ``step.writes``: frozensets of :class:`Data`)."""
    reads, writes = frozenset(reads), frozenset(writes)
    unknown = {item for item in reads | writes if not isinstance(item, Data)}
    if unknown:
        raise TypeError(f"a step declares what it reads and writes as Data, not {sorted(map(repr, unknown))}")

    def declare(step: Step) -> Step:
        step.reads, step.writes = reads, writes
        return step

    return declare


@dataclass
class EagerReference:
    """What the artifacts are validated against, from the eager model."""

    expected: list[Any]  # eager's outputs for each shape case
    gate: Any  # task metrics on real data, when the recipe asks
    generation: Any  # eager generate's tokens (a GenerationReference), for a decoder step


@dataclass
class Work:
    """What the stages hand each other. The schedule empties a field once no later stage takes it."""

    staging: Path  # the output directory being written
    model: torch.nn.Module | None = None
    cases: list[ShapeCase] = field(default_factory=list)
    axes: dict[str, dict[int, str]] = field(default_factory=dict)  # {input: {axis: dim}} kept dynamic
    ranges: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # {dim: (min, max)}
    onnx_names: dict[str, str] = field(default_factory=dict)  # {input: ONNX input name} where they differ
    graph: torch.fx.GraphModule | None = None
    kind_graphs: dict[str, torch.fx.GraphModule] = field(default_factory=dict)  # lowered for one kind (export.<kind>.passes)
    reference: EagerReference | None = None
    onnx_export: OnnxStage | None = None  # the export under way, from its start to its finish
    checks: ArtifactChecks | None = None
    hashed: dict[str, Any] = field(default_factory=dict)  # files hashed while the ONNX export ran


@declares(writes={Data.MODEL_WEIGHTS, Data.MODEL_STRUCTURE})
def load(plan: ModelPlan, work: Work, report: BuildReport, while_weights_load: AbstractContextManager[Any]) -> None:
    work.model = load_model(plan, while_weights_load=while_weights_load)
    check_input_names(plan, work.model)
    report.memory["weights_mib"] = round(_tensor_bytes(work.model) / 2**20, 1)


@declares(reads={Data.MODEL_STRUCTURE}, writes={Data.INPUTS})
def make_inputs(plan: InputsPlan, work: Work) -> None:
    """The example inputs at every shape case, and the dims the artifacts keep dynamic."""
    work.cases = shape_cases(plan, work.model)
    work.axes, work.ranges = dynamic_axes(plan, work.model), dim_ranges(plan, work.model)
    work.onnx_names = onnx_input_names(plan, work.model)


@declares(reads={Data.MODEL_WEIGHTS, Data.MODEL_STRUCTURE, Data.INPUTS}, writes={Data.GRAPH})
def trace(plan: TracePlan, work: Work, report: BuildReport) -> None:
    work.graph = capture(plan, work.model, work.cases[0].inputs, work.axes, work.ranges)
    report.trace = work.graph.meta.get("trace_report", {})


@declares(reads={Data.MODEL_WEIGHTS, Data.MODEL_STRUCTURE, Data.INPUTS}, writes={Data.REFERENCE})
def take_eager_reference(plan: ValidationPlan, work: Work) -> None:
    """Eager's outputs at every shape case, the gate's reference, and a decoder's generations."""
    model = work.model
    work.reference = EagerReference(
        expected=[eager_outputs(model, case.inputs) for case in work.cases],
        gate=make_gate(plan.gate, eager_runner(model), model),
        generation=generation_reference(plan.generation, model),
    )


# The eager guard reads which tensors the model holds, not what they hold: it serves on the meta device too.
@declares(reads={Data.GRAPH, Data.MODEL_STRUCTURE}, writes={Data.GRAPH})
def transform(plan: PassesPlan, work: Work, report: BuildReport) -> None:
    """The recipe's passes, each checked to leave the eager model as it was (its outputs may be taken after them)."""
    unchanged_eager_model = check_after_each_pass(work.model, list(plan.passes))
    graph = work.graph
    if plan.calibration is not None:
        graph.meta[CALIBRATION_KEY] = _calibration_inputs(plan.calibration, work.model)
        graph.meta[FIDELITY_TARGET_KEY] = dict(plan.calibration.fidelity_target)
    try:
        work.graph, report.passes = run_pipeline(graph, list(plan.passes), after_each=unchanged_eager_model)
    finally:  # the texts are the passes' alone: no artifact keeps them
        for key in (CALIBRATION_KEY, FIDELITY_TARGET_KEY):
            graph.meta.pop(key, None)
            if work.graph is not None:
                work.graph.meta.pop(key, None)
    widened = widen_leftover_linears(work.graph)  # narrow weights (model.weights_dtype) no pass replaced
    if widened:
        work.graph.meta.setdefault("trace_report", {}).setdefault("notes", []).append(
            f"widened {len(widened)} linear layers no pass replaced to {plan.compute_dtype}")


def _calibration_inputs(plan: CalibrationPlan, step: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    from aot.decoding.calibration import calibration_inputs

    made = calibration_inputs(step, calibration_prompts(plan))
    log.info("calibration: %d texts, %d tokens", len(made), sum(inputs[next(iter(inputs))].numel() for inputs in made))
    return made


@declares(reads={Data.GRAPH, Data.INPUTS, Data.REFERENCE}, writes={Data.GRAPH_CHECK, Data.GRAPH_DERIVED})
def check_graph(plan: ValidationPlan, work: Work, report: BuildReport) -> None:
    reference = work.reference
    report.validation, report.accuracy = validate_graph(plan, work.graph, work.cases, reference.expected, reference.gate)


@declares(writes={Data.FILES})
def write_recipe(plan: BuildPlan, work: Work) -> None:
    _write(lambda path, text: path.write_text(text, encoding="utf-8"), work.staging / "recipe.yaml", plan.recipe.text)


@declares(reads={Data.MODEL_STRUCTURE}, writes={Data.FILES})
def write_deployment(plan: DeploymentPlan, work: Work, report: BuildReport) -> None:
    report.deployment = write_deployment_files(plan, work.model, work.staging)


# The child drops its own view of the eager model's weights: it needs the model, not what its weights hold.
@declares(reads={Data.GRAPH, Data.MODEL_STRUCTURE, Data.INPUTS}, writes={Data.ONNX_EXPORT})
def start_onnx_export(plan: OnnxSpec, work: Work, on_child: Callable[[int], None]) -> None:
    """Start writing ``model.onnx`` from the graph as the passes left it (:mod:`aot.builder.onnx_stage`)."""
    work.onnx_export = OnnxStage.start(plan, work.graph, work.model, work.cases, work.staging / "model.onnx", work.axes,
                                       work.ranges, on_child=on_child, input_names=work.onnx_names)


@declares(reads={Data.GRAPH, Data.INPUTS, Data.REFERENCE}, writes={Data.GRAPH})
def prepare_graph_module(plan: ExportPlan, work: Work) -> None:
    """What ``module.py`` carries beside the graph: a decoder's ``generate()``, CUDA graph buckets."""
    generation = work.reference.generation
    if generation is not None:
        work.graph.meta["decoder"] = generation.artifact_meta
    buckets = plan.graph_module.cuda_graphs
    if buckets and plan.graph_module.enabled:  # module.py then replays its buckets from CUDA graphs (aot.cuda_graphs)
        work.graph.meta["cuda_graphs"] = cuda_graph_spec(buckets, work.axes, work.graph, work.cases, plan.model.device)


@declares(reads={Data.GRAPH}, writes={Data.KIND_GRAPHS})
def graph_module_passes(plan: ExportPlan, work: Work, report: BuildReport) -> None:
    """``export.graph_module.passes``: for the saved GraphModule only (the ONNX export took the graph before them)."""
    work.kind_graphs["graph_module"], records = run_pipeline(work.graph, list(plan.graph_module_passes))
    report.passes += records


@declares(reads={Data.GRAPH, Data.KIND_GRAPHS, Data.INPUTS}, writes={Data.FILES})
def write_artifact(kind: ArtifactKind, work: Work, report: BuildReport) -> None:
    """One artifact kind's files, written into the staging directory by the kind's own writer."""
    graph = work.kind_graphs.get(kind.name, work.graph)  # a graph lowered for this kind alone, where it has one
    written = kind.write(graph, WriteContext(work.staging, work.cases[0].inputs, work.axes, work.ranges))
    if kind.manifest_key:
        report.artifact_sections[kind.manifest_key] = kind.manifest_section(written)


# The export holds what it reads from its start: its child's view of the graph, or in process the graph it took.
@declares(reads={Data.ONNX_EXPORT}, writes={Data.FILES})
def finish_onnx_export(plan: ExportPlan, work: Work, report: BuildReport, stage: Callable[[str], AbstractContextManager[None]]) -> None:
    """Wait for the export (``stage("export_onnx")``, and ``"optimize_onnx"`` where the file-level optimiser runs)."""
    export = work.onnx_export
    report.onnx_fusions = export.finish(work.staging / "model.onnx", plan.model, stage)
    report.onnx_lowering = export.lowering


@declares(reads={Data.REFERENCE, Data.INPUTS}, writes={Data.FILE_CHECKERS})
def artifact_checks(plan: ValidationPlan, work: Work) -> None:
    """The files written, loaded as users load them; each check timed by the schedule."""
    reference = work.reference
    work.checks = ArtifactChecks(plan, work.cases, reference.expected, work.staging, untimed_stage, reference.gate, work.onnx_names)


@declares(reads={Data.FILE_CHECKERS, Data.FILES}, writes={Data.FILE_CHECKS})
def check_artifact_files(work: Work, kind: ArtifactKind, report: BuildReport) -> None:
    """One kind's files, loaded as users load them, against eager; code runs only as hashed (``report.files``)."""
    validation, accuracy = work.checks.check(kind, lambda relative: report.files[relative]["sha256"])
    report.validation += validation
    report.accuracy += accuracy


@declares(reads={Data.REFERENCE, Data.FILES}, writes={Data.FILE_CHECKS})
def check_generation(work: Work, report: BuildReport) -> None:
    report.generation = work.reference.generation.check_files(work.staging, saved_graph_module_opener(lambda relative: report.files[relative]["sha256"]))


@declares(reads={Data.GRAPH_CHECK, Data.FILE_CHECKS})
def raise_on_failed_checks(report: BuildReport) -> None:
    """A ValidationError naming the first check that failed, before anything is recorded as built."""
    raise_on_failure(report.validation, report.accuracy + report.generation)


@declares(reads={Data.GRAPH_CHECK, Data.FILE_CHECKS, Data.FILES}, writes={Data.FILES})
def write_build_manifest(plan: BuildPlan, work: Work, report: BuildReport) -> None:
    notes = {key: line for kind in enabled_kinds(plan.export) for key, line in kind.deployment_notes(work.staging).items()}
    manifest_path = _write(write_manifest, work.staging, manifest(plan, report, notes))
    report.manifest_sha256 = hashlib.sha256(manifest_path.read_bytes()).hexdigest()


def manifest(plan: BuildPlan, report: BuildReport, deployment_notes: dict[str, str] | None = None) -> dict[str, Any]:
    """The manifest's content; ``deployment_notes``: the enabled artifact kinds' lines for its deployment section."""
    deployment = report.deployment.to_json() if report.deployment is not None else None
    if deployment is not None and deployment_notes:
        deployment = {**deployment, **deployment_notes}
    return {
        "manifest_version": MANIFEST_VERSION,
        "name": plan.name,
        "recipe": plan.recipe.to_manifest(),
        "versions": tool_versions(),
        "trace": {key: value for key, value in report.trace.items() if key != "duration_s"},
        "passes": [{k: v for k, v in p.to_json().items() if k != "seconds"} for p in report.passes],
        "onnx_fusions": report.onnx_fusions,
        "onnx_lowering": report.onnx_lowering,
        "validation": [c.to_json() for c in report.validation],
        "accuracy": [a.to_json() for a in report.accuracy],
        "generation": [g.to_json() for g in report.generation],
        DEPLOYMENT_KEY: deployment,
        **{kind.manifest_key: report.artifact_sections.get(kind.manifest_key) for kind in artifact_kinds() if kind.manifest_key},
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


def _tensor_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _write(writer, path: Path, *args):
    """``writer(path, *args)``, with a full disk or a lost permission reported as an export failure naming the file."""
    try:
        return writer(path, *args)
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror or error}") from None
