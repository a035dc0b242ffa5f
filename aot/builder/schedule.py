"""How a build's stages are scheduled: what overlaps, what is forked, and when memory is freed.

The spine (:func:`aot.builder.spine._build`) runs the stages in the order of their data, and gives the schedule
that order (:data:`aot.builder.spine.SPINE`); each stage declares what it reads and what it writes
(:func:`aot.builder.steps.declares`). From those declarations alone, never from a stage's name, :func:`decide` says
what runs beside the export and when each object goes, and :class:`BuildSchedule` runs the stages so, on a machine
of two cores and little memory to spare:

- **Imports beside the weights.** While a transformers model draws or reads its weights
  (kernels that release the GIL), the export stack is imported on a thread
  (:mod:`aot.process.imports_beside`): it would otherwise be imported on the critical path, in the
  export's child.
- **The ONNX export beside the eager work.** The export, the longest stage, needs nothing made
  after the passes, so it is forked into a child (:mod:`aot.builder.onnx_stage`) as soon as the
  deployment files are written. A stage that runs a model (it reads the eager model's weights or the
  graph) and that the export does not wait on (neither the export nor a stage kept before it reads what
  it writes or writes what it reads) runs after the fork, beside it, on one thread: the eager reference
  and the graph's validation. Stages that run no model (the recipe, the deployment files) stay where
  the spine puts them: they are quick. The other artifacts' writes follow, then
  :meth:`BuildSchedule.finish_onnx_export`; the files written by then are hashed while the child works.
- **Hashing beside ONNX Runtime.** The ONNX files are hashed on a thread while ONNX Runtime
  validates them: both wait in code that releases the GIL.
- **Memory.** Each object that holds weights is dropped, and freed memory given back to the system
  (:func:`aot.process.memory.release_freed_memory`), once the last stage that reads it, in the order
  they run, is done: the eager model once the export has started and the reference is taken; the graph
  once the artifacts written in this process are (the export holds its own: the child's copy-on-write
  view, or in process the graph it took at its start, which goes when it is done). The eager model's
  weights and its structure are two objects: where the structure is read after the weights, the weights
  go to the meta device first. What running the graph derives (:data:`aot.builder.steps.CACHES`:
  nothing reads it) is dropped after the stage that made it while the export is still to fork, so that
  the child does not work beside it; made after the fork, it goes with the graph. A stage that reads
  what was freed cannot run: the spine must run its stages in the order it gives.
- **Memory first.** A model that keeps narrow weights (``model.weights_dtype``) runs nothing beside the
  export (see :data:`MEMORY_FIRST`): in the spine's order, its reference is taken before the passes, so
  its weights go to the meta device while its structure still serves the passes' guard, the deployment
  files and the export's start, and its graph is validated before the export forks, which drops what
  the graph's layers derived first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any

from aot.builder import steps
from aot.builder.report import BuildReport
from aot.builder.stages import Progress, Stages
from aot.builder.steps import CACHES, WEIGHTS, Data, Work
from aot.compat.torch_private import EXPORT_STACK_MODULES
from aot.directory.manifest import describe_files, hash_files
from aot.process.imports_beside import imports_beside
from aot.process.memory import MemoryWatch, release_freed_memory, resident_mib
from aot.recipe.plan import BuildPlan


log = logging.getLogger(__name__)

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


FREED = frozenset({Data.MODEL_WEIGHTS, Data.MODEL_STRUCTURE, Data.GRAPH, Data.GRAPH_DERIVED, Data.KIND_GRAPHS})
"""What the schedule frees: what holds weights. The rest (inputs, reference, checks) is small, and kept to the end."""
_HOLDS = {Data.MODEL_STRUCTURE: Data.MODEL_WEIGHTS, Data.GRAPH: Data.GRAPH_DERIVED}
"""Dropping the first drops the second: it goes no earlier than the second's last reader."""


@dataclass(frozen=True)
class Decisions:
    """What :func:`decide` makes of the spine's declared steps."""

    spine: tuple[Callable[..., Any], ...]  # the steps in the order the spine runs them
    order: tuple[Callable[..., Any], ...]  # the order they run in: the deferred ones just after the export's start
    deferred: frozenset[Callable[..., Any]]  # run beside the export, once it has forked
    freed_after: dict[int, frozenset[Data]]  # {index in order: what goes once that step's last run is done}


def decide(spine: Sequence[Callable[..., Any]], memory_first: bool) -> Decisions:
    """The schedule's decisions, from what each step of ``spine`` (in the spine's order) reads and writes.

    The export's start is the step that writes :attr:`Data.ONNX_EXPORT`. Before it, a step that runs a model (reads
    :data:`aot.builder.steps.WEIGHTS`) moves after it when nothing kept between them, the start included, reads
    what it writes or writes what it reads: the moved steps run beside the export, in the spine's order. Nothing
    moves when the build is ``memory_first``. Each object of :data:`FREED` goes after the last step that reads it in
    the order they run; a cache (:data:`aot.builder.steps.CACHES`) after the step that made it, when that runs before
    the export's start.
    """
    spine = tuple(spine)
    starts = [index for index, step in enumerate(spine) if Data.ONNX_EXPORT in step.writes]
    if len(starts) != 1:
        raise ValueError(f"the spine must have one step that starts the export (writes {Data.ONNX_EXPORT}), not {len(starts)}")
    start = starts[0]
    deferred = () if memory_first else _beside_export(spine[:start + 1])
    order = tuple(step for step in spine[:start + 1] if step not in deferred) + deferred + spine[start + 1:]
    forks_at = order.index(spine[start])
    last: dict[Data, int] = {}
    for index, step in enumerate(order):
        for data in step.reads & FREED:
            last[data] = index
        for data in step.writes & CACHES & FREED:
            if index < forks_at:
                last[data] = index
    for holder, held in _HOLDS.items():
        if held in last:
            last[holder] = max(last.get(holder, 0), last[held])
    freed_after: dict[int, set[Data]] = {}
    for data, index in last.items():
        freed_after.setdefault(index, set()).add(data)
    return Decisions(spine, order, frozenset(deferred), {index: frozenset(data) for index, data in freed_after.items()})


def _beside_export(until_start: tuple[Callable[..., Any], ...]) -> tuple[Callable[..., Any], ...]:
    """The steps before the export's start (the last of ``until_start``) that can run after it: see :func:`decide`."""
    kept, moved = [until_start[-1]], []
    for step in reversed(until_start[:-1]):
        waited_on = any(step.writes & (later.reads | later.writes) or step.reads & later.writes for later in kept)
        if step.reads & WEIGHTS and not waited_on:
            moved.insert(0, step)
        else:
            kept.append(step)
    return tuple(moved)


class BuildSchedule:
    """Runs the spine's stages: times each, and applies the overlaps and the frees described above.

    ``spine``: the steps in the order the spine runs them. Use it as a context manager: leaving it on an error
    cancels an export still running.
    """

    def __init__(self, plan: BuildPlan, work: Work, report: BuildReport, progress: Progress | None, memory: MemoryWatch,
                 started: float, *, spine: Sequence[Callable[..., Any]]):
        self._plan, self._work, self._report, self._memory, self._started = plan, work, report, memory, started
        self.memory_first = plan.model.spec.weights_dtype is not None  # see MEMORY_FIRST
        self.decisions = decide(spine, self.memory_first)
        self._stages = Stages(progress, after=self._note_memory)
        self._stages.seconds = report.stages
        self._deferred: list[tuple[str | None, Callable[..., Any], tuple[Any, ...]]] = []
        self._forked = False
        self._spine_at = 0  # where the spine is in its order
        self._freed: set[Data] = set()
        self._beside_export = ExitStack()

    def __enter__(self) -> BuildSchedule:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and self._work.onnx_export is not None:
            self._work.onnx_export.cancel()
        self._beside_export.close()

    @property
    def while_weights_load(self) -> AbstractContextManager[Any]:
        """Entered while the model's weights are drawn or read: the export stack is imported beside them."""
        return imports_beside(_EXPORT_MODULES if self._plan.export.onnx.enabled else ())

    def run(self, stage: str, step: Callable[..., Any], *args: Any, when: bool = True) -> None:
        """``step(*args)`` as the timed stage ``stage`` (nothing when ``when`` is false), now or where the schedule puts it."""
        self._follow_spine(step)
        if not when:
            return
        if step in self.decisions.deferred and not self._forked:
            self._deferred.append((stage, step, args))
            return
        self._run(stage, step, args)

    def run_untimed(self, step: Callable[..., Any], *args: Any) -> None:
        """``step(*args)``, too quick to report as a stage of its own; freed objects go first, as before any stage."""
        self._follow_spine(step)
        self._run(None, step, args)

    def start_onnx_export(self) -> None:
        """Fork the ONNX export (or prepare it in process), then run beside it what was deferred to here."""
        work = self._work
        self.run_untimed(steps.start_onnx_export, self._plan.export.onnx, work, self._memory.track)
        self._forked = True
        self._beside_export.enter_context(work.onnx_export.beside())
        for stage, step, args in self._deferred:
            self._run(stage, step, args)
        self._deferred.clear()

    def finish_onnx_export(self) -> None:
        """Hash what is written while the export runs, then wait for it."""
        work = self._work
        work.hashed = hash_files(work.staging)
        self._beside_export.close()
        self.run_untimed(steps.finish_onnx_export, self._plan.export, work, self._report, self._stages)

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
        self.run_untimed(step, *args)

    def _follow_spine(self, step: Callable[..., Any]) -> None:
        """The schedule's decisions hold while the spine runs its steps in the order it gave (a step may repeat)."""
        spine = self.decisions.spine
        if step not in spine:
            raise RuntimeError(f"{step.__qualname__} is not among the steps the spine gave the schedule")
        at = spine.index(step)
        if at < self._spine_at:
            raise RuntimeError(f"the spine runs {step.__qualname__} after {spine[self._spine_at].__qualname__}, "
                               "out of the order it gave the schedule")
        self._spine_at = at

    def _run(self, stage: str | None, step: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._free_before(self.decisions.order.index(step))
        freed = step.reads & self._freed
        if freed:
            raise RuntimeError(f"{step.__qualname__} reads {', '.join(sorted(data.name for data in freed))}, freed before it")
        if stage is None:
            step(*args)
            return
        with self._stages(stage):
            step(*args)

    def _free_before(self, index: int) -> None:
        """Free what the steps that run before ``index`` were the last to read."""
        due = {data for at, items in self.decisions.freed_after.items() if at < index for data in items} - self._freed
        if not due:
            return
        work = self._work
        if Data.MODEL_STRUCTURE in due:  # its weights go with it, now or before
            work.model = None  # its outputs are the reference; the graph is now its weights' only owner
        elif Data.MODEL_WEIGHTS in due:
            work.model.to(device="meta")  # its structure still serves later stages; its weights go
        if Data.GRAPH in due:
            work.graph = None
        elif Data.GRAPH_DERIVED in due and work.graph is not None:
            work.graph.to(device=self._plan.export.model.device)  # drops what layers derived at their first call
        if Data.KIND_GRAPHS in due:
            work.kind_graphs.clear()
        self._freed |= due | {_HOLDS[holder] for holder in due & _HOLDS.keys()}
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
