"""How a build's stages are scheduled: what overlaps, what is forked, and when memory is freed.

The spine (:func:`aot.builder.spine._build`) names the stages in the order of their data. This is the
one place that decides how they run on a machine of two cores and little memory to spare:

- **Imports beside the weights.** While a transformers model draws or reads its weights
  (kernels that release the GIL), the export stack is imported on a thread
  (:mod:`aot.process.imports_beside`): it would otherwise be imported on the critical path, in the
  export's child.
- **The ONNX export beside the eager work.** The export, the longest stage, needs nothing made
  after the passes, so it is forked into a child (:mod:`aot.builder.onnx_stage`) as soon as the
  deployment files are written. The stages between :meth:`BuildSchedule.start_onnx_export` and
  :meth:`BuildSchedule.finish_onnx_export` run beside it on one thread: by default the eager
  reference, the graph's validation (both deferred to here), and the other artifacts' writes.
  The files written by then are hashed while the child works.
- **Hashing beside ONNX Runtime.** The ONNX files are hashed on a thread while ONNX Runtime
  validates them: both wait in code that releases the GIL.
- **Memory.** Each object is dropped, and freed memory given back to the system
  (:func:`aot.process.memory.release_freed_memory`), when no later stage takes it: the eager model once
  the export has started and the reference is taken; the graph once the export holds its own
  copy, or once the export is done. A model that keeps narrow weights (``model.weights_dtype``)
  is scheduled memory first instead: its reference and its graph's validation run before the
  export forks (see :data:`MEMORY_FIRST`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from aot.directory.manifest import describe_files, hash_files
from aot.builder.onnx_stage import OnnxStage
from aot.builder.report import BuildReport
from aot.builder.stages import Progress, Stages
from aot.builder.steps import Work
from aot.compat.torch_private import EXPORT_STACK_MODULES
from aot.process.imports_beside import imports_beside
from aot.process.memory import MemoryWatch, release_freed_memory, resident_mib
from aot.recipe.plan import BuildPlan


log = logging.getLogger(__name__)

DEFERRED_BESIDE_EXPORT = ("eager_outputs", "validate_graph")
"""Stages run beside the ONNX export, wherever the spine names them, unless the build is scheduled memory first."""

MEMORY_FIRST = """A model that keeps narrow weights (model.weights_dtype, meant for models whose size is the problem)
takes its reference before the passes, and its weights then go: the graph is their last owner, and each layer a
pass replaces frees its float weight at once. Taken after, the eager model would hold every weight beside the
merged and quantised ones. Its graph is then validated before the export forks, and what its layers derived for
that at their first call (a weight-only layer's int8 codes: 1.1 GB for a 1B model) dropped, so that the export
child's copy is not counted beside them. The price: the export no longer overlaps the eager work or the graph's
validation. Measured on the Llama-3.2-1B-shaped int4 recipe: a peak of 8.0 GB taken after the passes, 3.6 GB taken
before them with the export beside the graph's validation, and 3.2 GB validated first."""

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


class BuildSchedule:
    """Runs the spine's stages: times each, and applies the overlaps and the frees described above.

    Use it as a context manager: leaving it on an error cancels an export still running.
    """

    def __init__(self, plan: BuildPlan, work: Work, report: BuildReport, progress: Progress | None, memory: MemoryWatch,
                 started: float):
        self._plan, self._work, self._report, self._memory, self._started = plan, work, report, memory, started
        self.memory_first = plan.model.spec.weights_dtype is not None  # see MEMORY_FIRST
        self._stages = Stages(progress, after=self._note_memory)
        self._stages.seconds = report.stages
        self._deferred: list[tuple[str, Callable[[], Any]]] = []
        self._onnx: OnnxStage | None = None
        self._beside_export = ExitStack()

    def __enter__(self) -> BuildSchedule:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and self._onnx is not None:
            self._onnx.cancel()
        self._beside_export.close()

    @property
    def while_weights_load(self) -> AbstractContextManager[Any]:
        """Entered while the model's weights are drawn or read: the export stack is imported beside them."""
        return imports_beside(_EXPORT_MODULES if self._plan.export.onnx.enabled else ())

    def run(self, stage: str, step: Callable[..., Any], *args: Any, when: bool = True) -> None:
        """``step(*args)`` as the timed stage ``stage`` (nothing when ``when`` is false), now or where the schedule puts it."""
        if not when:
            return
        if stage in DEFERRED_BESIDE_EXPORT and not self.memory_first and self._onnx is None:
            self._deferred.append((stage, lambda: step(*args)))
            return
        with self._stages(stage):
            step(*args)
        self._after(stage)

    def start_onnx_export(self) -> None:
        """Fork the ONNX export (or prepare it in process), then run beside it what was deferred to here."""
        work, options = self._work, self._plan.export.onnx
        self._onnx = OnnxStage.start(options, work.graph, work.model, work.cases, work.staging / "model.onnx", work.axes,
                                     work.ranges, on_child=self._memory.track, input_names=work.onnx_names)
        self._beside_export.enter_context(self._onnx.beside())
        for stage, step in self._deferred:
            with self._stages(stage):
                step()
            self._after(stage)
        self._deferred.clear()
        if work.model is not None:  # scheduled memory first: its structure served the export's start
            self._drop_model()

    def finish_onnx_export(self) -> None:
        """Hash what is written while the export runs, then wait for it; the graph goes once the export is done with it."""
        work, onnx = self._work, self._onnx
        work.hashed = hash_files(work.staging)
        if onnx.in_child:  # the child exports from its own view of the graph: this one goes now, not after
            self._drop_graph()
        self._beside_export.close()
        self._report.onnx_fusions = onnx.finish(work.staging / "model.onnx", self._plan.export.model, self._stages)
        if work.graph is not None:  # exported in process (or not at all); the artifacts are validated from disk, as deployed
            self._drop_graph()

    def run_hashing_beside(self, stage: str, step: Callable[..., Any], *args: Any) -> None:
        """``run(stage, step, *args)`` while the files not hashed yet are hashed on a thread: both release the GIL."""
        work = self._work
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-hash") as hashing:
            files = hashing.submit(describe_files, work.staging, work.hashed)
            self.run(stage, step, *args, when=self._plan.export.onnx.enabled)
            self._report.files = files.result()

    def last(self, step: Callable[..., Any], *args: Any) -> None:
        """The last step (the manifest): the build's time and memory figures are final when it runs."""
        self._note_time_and_memory()
        step(*args)

    def _after(self, stage: str) -> None:
        """Free what the stage that just ended was the last to take."""
        work = self._work
        if stage == "eager_outputs" and not self.memory_first:
            self._drop_model()
        elif stage == "eager_outputs":
            work.model.to(device="meta")  # its structure still serves (deployment files, the export's start); its weights go
            release_freed_memory()
        elif stage == "validate_graph" and self.memory_first:
            work.graph.to(device=self._plan.export.model.device)  # drops what layers derived at their first call
            release_freed_memory()

    def _drop_model(self) -> None:
        self._work.model = None  # its outputs are the reference; the graph is now its weights' only owner
        release_freed_memory()

    def _drop_graph(self) -> None:
        self._work.graph = None
        self._work.kind_graphs.clear()
        release_freed_memory()

    def _note_memory(self, stage: str) -> None:
        self._report.peak_rss_by_stage[stage] = self._memory.peak_mib()
        log.debug("%s: resident %.0f MiB, peak %.0f MiB", stage, resident_mib(), self._report.peak_rss_by_stage[stage])

    def _note_time_and_memory(self) -> None:
        report, memory = self._report, self._memory
        report.stages["total"] = round(time.perf_counter() - self._started, 3)
        figures = report.memory
        figures["start_rss_mib"] = round(memory.start_mib, 1)
        figures["peak_rss_mib"] = memory.peak_mib()
        figures["peak_over_start_mib"] = round(figures["peak_rss_mib"] - memory.start_mib, 1)
        weights = figures["weights_mib"] or 1.0
        figures["peak_per_weights"] = round(figures["peak_rss_mib"] / weights, 2)
        figures["peak_over_start_per_weights"] = round(figures["peak_over_start_mib"] / weights, 2)
