"""``aot build``: recipe → plan → model → inputs → trace → passes → validate → artifacts → manifest.

The library never prints: it logs, reports progress through an optional
callback, and returns a :class:`BuildReport`. Errors are :class:`AotError`
subclasses whose exit codes the CLI maps; the output directory is only
replaced when every stage, artifact validation included, has succeeded.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from aot.builder import steps
from aot.directory.consent import remember_build
from aot.directory.outdir import check_replaceable, staged_directory
from aot.builder.report import BuildReport
from aot.builder.schedule import BuildSchedule
from aot.builder.stages import Progress
from aot.compat.window import warn_outside_window
from aot.export.kinds import enabled_kinds, in_check_order
from aot.process.memory import MemoryWatch
from aot.recipe.load import LoadedRecipe, load_recipe
from aot.recipe.plan import BuildPlan, plan_build

log = logging.getLogger(__name__)

__all__ = ["BuildReport", "build", "default_output"]


SPINE = (
    steps.load, steps.make_inputs, steps.trace, steps.take_eager_reference, steps.transform, steps.check_graph,
    steps.write_recipe, steps.write_deployment, steps.start_onnx_export, steps.prepare_graph_module,
    steps.graph_module_passes, steps.write_artifact, steps.finish_onnx_export, steps.artifact_checks,
    steps.check_artifact_files, steps.check_generation, steps.raise_on_failed_checks, steps.write_build_manifest,
)
"""The steps in the order :func:`_build` runs them (a step run once per artifact kind counts once): the schedule
decides from what each declares it reads and writes, and stops a build that runs them in another order."""


def default_output(recipe: str | Path | LoadedRecipe | BuildPlan) -> Path:
    """Where :func:`build` writes ``recipe`` (a path, a loaded recipe or its plan) when given no output: the recipe's
    ``output``, else ``out/NAME``."""
    if not isinstance(recipe, BuildPlan):
        recipe = plan_build(recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe))
    return recipe.output if recipe.output is not None else Path("out") / recipe.name


def build(
    recipe: str | Path | LoadedRecipe, output: str | Path | None = None, progress: Progress | None = None
) -> BuildReport:
    """Build a recipe (a path, or one :func:`aot.recipe.load.load_recipe` already loaded) into ``output``."""
    started = time.perf_counter()
    plan = plan_build(recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe))
    target = Path(output) if output is not None else default_output(plan)
    check_replaceable(target)  # before any work: aot never deletes what it did not write
    warn_outside_window()
    report = BuildReport(name=plan.name, output=str(target))
    memory = MemoryWatch()
    try:
        with staged_directory(target) as staging:
            work = steps.Work(staging)
            with BuildSchedule(plan, work, report, progress, memory, started, spine=SPINE) as schedule:
                _build(plan, work, report, schedule)
    finally:
        memory.stop()
    return report


def _build(plan: BuildPlan, work: steps.Work, report: BuildReport, schedule: BuildSchedule) -> None:
    """The spine: each stage, the section of the plan it takes, and what it makes, in the order of :data:`SPINE`.

    Stages run in this order, except where :mod:`aot.builder.schedule` says otherwise, from what each stage
    declares it reads and writes: it runs the stages that run a model and that the ONNX export does not wait
    on (the eager reference, the graph's validation) beside the export, imports the export stack while the
    weights load, hashes files beside the work that waits on other code, and frees what no later stage reads.
    """
    run = schedule.run
    run("load_model", steps.load, plan.model, work, report, schedule.while_weights_load)
    run("make_inputs", steps.make_inputs, plan.inputs, work)
    run("trace", steps.trace, plan.trace, work, report)
    run("eager_outputs", steps.take_eager_reference, plan.validation, work)
    run("passes", steps.transform, plan.passes, work, report)
    run("validate_graph", steps.check_graph, plan.validation, work, report)
    schedule.run_untimed(steps.write_recipe, plan, work)
    run("deployment_files", steps.write_deployment, plan.deployment, work, report)

    schedule.start_onnx_export()
    export = plan.export
    schedule.run_untimed(steps.prepare_graph_module, export, work)
    run("graph_module_passes", steps.graph_module_passes, export, work, report,
        when=export.graph_module.enabled and bool(export.graph_module_passes))
    kinds = enabled_kinds(export)
    for kind in kinds:
        if not kind.written_beside:
            run(f"export_{kind.name}", steps.write_artifact, kind, work, report)
    schedule.finish_onnx_export()

    schedule.run_untimed(steps.artifact_checks, plan.validation, work)
    # Code runs as hashed: what the manifest lists is what was validated.
    for kind in in_check_order():
        if kind.written_beside:  # its check overlaps the hashing of what it wrote (and of the rest)
            schedule.run_hashing_beside(f"validate_{kind.name}", steps.check_artifact_files, work, kind, report)
        elif kind in kinds:
            run(f"validate_{kind.name}", steps.check_artifact_files, work, kind, report)
    run("validate_generation", steps.check_generation, work, report, when=plan.validation.generation is not None)
    schedule.run_untimed(steps.raise_on_failed_checks, report)
    schedule.last(steps.write_build_manifest, plan, work, report)
    remember_build(report.manifest_sha256)  # this machine built it: its code may run here later (aot.directory.consent)
