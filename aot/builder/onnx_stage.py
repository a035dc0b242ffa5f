"""The build's ONNX stage behind one call: export beside the rest of the build, then wait.

The export (torch.export, its translation to ONNX, the fusions, the write) is the longest
stage and needs nothing the rest of the build produces after the passes. So it runs in a
forked child (:mod:`aot.process.forked`) while the build takes the eager reference outputs,
validates the graph and writes the GraphModule artifact with the other core. What the
exporter and onnxscript cache (the graph, and through it the weights) goes away with the
child. Where no child can be forked (CUDA in use, no ``fork``), the export runs in process
when :meth:`OnnxStage.finish` asks for it.

Memory: the graph's weights are copy-on-write clones of the eager model's. The exporter
reads them through mutable pointers, which copies a clone unless it is its storage's last
owner; so the child first drops its own copy of the eager model's weights.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from aot.inputs import ShapeCase
from aot.process.forked import ForkedStep
from aot.recipe.schema import OnnxSpec, ModelSpec
from aot.export.onnx_artifact import float16_after_writing, optimizes_after_writing, writer_options
from aot.gates.compare import run_module
from aot.tracing.outputs import graph_output_names

log = logging.getLogger(__name__)


def _output_names_by_running(graph_module: torch.fx.GraphModule, cases: list[ShapeCase]) -> list[str]:
    # The names do not depend on the shape: the smallest case finds them fastest.
    smallest = min(cases, key=lambda case: sum(t.numel() for t in case.inputs.values() if isinstance(t, torch.Tensor)))
    return list(run_module(graph_module, smallest))


class OnnxStage:
    """``start`` it, do the other work inside :meth:`beside`, then :meth:`finish`; :meth:`cancel` on failure."""

    def __init__(self, options: OnnxSpec, step: ForkedStep | None):
        self.options, self._step = options, step
        self.lowering: list[dict[str, Any]] = []  # what the ONNX unit's lowering passes did, once finished (onnx_lowering)

    @classmethod
    def start(
        cls,
        options: OnnxSpec,
        graph_module: torch.fx.GraphModule,
        eager_model: torch.nn.Module,
        cases: list[ShapeCase],
        path: Path,
        axes: dict[str, dict[int, str]],
        ranges: dict[str, tuple[int | None, int | None]],
        on_child: Callable[[int], None] | None = None,
        input_names: dict[str, str] | None = None,
    ) -> OnnxStage:
        """Start writing ``path`` from the graph as the passes left it (nothing when ONNX is off).

        ``input_names``: ``{graph input: ONNX input name}`` where the two differ (a decoder step's past).
        """
        if not options.enabled:
            return cls(options, None)
        from aot import export

        output_names = graph_output_names(graph_module) or _output_names_by_running(graph_module, cases)
        parent, eager = os.getpid(), weakref.ref(eager_model)

        def export_onnx() -> Any:
            model = eager()
            if os.getpid() != parent and model is not None:
                model.to(device="meta")  # in the child only: the graph becomes its weights' last owner
            del model
            return export.write_onnx(graph_module, path, cases[0].inputs, axes, output_names=output_names, dim_ranges=ranges,
                                     input_names=input_names, **writer_options(options))

        return cls(options, ForkedStep("export_onnx", export_onnx, on_child=on_child))

    @property
    def in_child(self) -> bool:
        """Whether the export runs in a forked child, beside the build (not in process, nor not at all)."""
        return self._step is not None and not self._step.in_process

    @contextmanager
    def beside(self) -> Iterator[None]:
        """Torch's threads for work done while the child exports: one core is the child's.

        Two threads here would slow the export, the longest stage, more than they speed up
        what runs beside it.
        """
        if not self.in_child:
            yield
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    def finish(self, path: Path, model: ModelSpec, stage: Callable[[str], AbstractContextManager[None]] = lambda _: nullcontext()) -> dict[str, int]:
        """Wait for the export (stage ``export_onnx``) and run the file-level optimiser; the fusion counts.
        :attr:`lowering` then says what the lowering passes did."""
        if self._step is None:
            return {}
        step, self._step = self._step, None  # in process, its function holds the graph: that goes with the export
        with stage("export_onnx"):  # the wait for the child, beyond the stages that ran beside it
            exported = step.result()
        del step
        fusions, self.lowering = exported.fusions, exported.lowering
        if optimizes_after_writing(self.options):
            from aot import export

            with stage("optimize_onnx"):  # ONNX Runtime's optimizer works on files: it loads the weights whole
                export.optimize_onnx(path, self.options.optimize, model, self.options.target, float16=float16_after_writing(self.options))
        return fusions

    def cancel(self) -> None:
        if self._step is not None:
            self._step.cancel()
