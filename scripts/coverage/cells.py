"""One cell of the table: a class traced with one frontend, or one architecture built end to end.

Each function raises on failure (the runner keeps the first line) and returns nothing.
The model is built afresh, from the tiny config with seed 0, in the process that runs
the cell: the runner forks one per cell.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch

from aot.errors import AotError
from aot.tracing import export_trace, symbolic_trace
from aot.tracing.dummy_inputs import default_input_names
from aot.tracing.shape_check import same_random_draws
from aot.gates.compare import compare_outputs, eager_outputs
from aot.tracing.outputs import flatten_outputs

from .architectures import find_class
from .shapes import SHAPES, inputs_at, named_axes
from .tiny_config import tiny_config

# The tracing zoo's tolerance (tests/tracing/tracing_zoo.py): a faithful graph of a tiny
# float32 model is within float rounding of eager.
ATOL = 1e-5
RTOL = 1e-5


class Mismatch(Exception):
    """The graph runs, but its outputs are not eager's."""


def build_model(model_type: str, class_name: str) -> torch.nn.Module:
    """``class_name`` from ``model_type``'s tiny config, weights from seed 0, as a recipe's ``model.config`` builds it."""
    cls = find_class(model_type, class_name)
    if cls is None:
        raise LookupError(f"transformers has no class {class_name}")
    config = tiny_config(model_type, cls)
    torch.manual_seed(0)
    model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
    return model.eval()


def check_at_shapes(model: torch.nn.Module, graph_module: torch.fx.GraphModule, frontend: str) -> None:
    names = default_input_names(model)
    for batch, sequence in SHAPES:
        inputs = inputs_at(model, names, batch, sequence)
        with same_random_draws():
            expected = eager_outputs(model, inputs)
        with torch.no_grad(), same_random_draws():
            actual = flatten_outputs(graph_module(**inputs))
        comparison = compare_outputs(frontend, f"batch {batch}, sequence {sequence}", expected, actual, ATOL, RTOL)
        if not comparison.ok:
            raise Mismatch(comparison.summary())


def trace_fx(model_type: str, class_name: str) -> None:
    model = build_model(model_type, class_name)
    graph_module = symbolic_trace(model)  # aot's dummy inputs for the default input names
    check_at_shapes(model, graph_module, "fx")


def trace_export(model_type: str, class_name: str) -> None:
    model = build_model(model_type, class_name)
    names = default_input_names(model)
    batch, sequence = SHAPES[0]
    graph_module = export_trace(model, inputs_at(model, names, batch, sequence), named_axes(model, names))
    check_at_shapes(model, graph_module, "export")


def export_hf_onnx(model_type: str, class_name: str) -> None:
    """transformers' own exporter (``OnnxExporter``, 5.24+), as its documentation shows it: dynamic on the axes
    that follow the shape, its CPU fusions; the ONNX model run in ONNX Runtime against eager at every shape."""
    import onnxruntime

    from aot.bench.peers import write_peer_onnx

    model = build_model(model_type, class_name)
    names = default_input_names(model)
    batch, sequence = SHAPES[0]
    # Without a cache, as aot's frontends trace it and eager_outputs runs it: the same outputs to compare.
    config = getattr(model, "config", None)
    caching = [c for c in (config, *(getattr(config, key, None) for key in ("text_config", "decoder"))) if getattr(c, "use_cache", False)]
    for part in caching:
        part.use_cache = False
    with tempfile.TemporaryDirectory(prefix="aot-coverage-hf-") as directory:
        path = write_peer_onnx("hf_onnx", model, inputs_at(model, names, batch, sequence), named_axes(model, names), Path(directory))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        fed = [i.name for i in session.get_inputs()]
        for batch, sequence in SHAPES:
            inputs = inputs_at(model, names, batch, sequence)
            with same_random_draws():
                expected = eager_outputs(model, inputs)
            results = session.run(None, {name: inputs[name].numpy() for name in fed})
            produced = [o.name for o in session.get_outputs()]
            # Its outputs carry the model output's names where it kept them (compared by name); else eager's order.
            if set(produced) & set(expected):
                actual = {key: torch.from_numpy(value) for key, value in zip(produced, results) if key in expected}
            else:
                actual = {key: torch.from_numpy(value) for key, value in zip(expected, results)}
            comparison = compare_outputs("hf_onnx", f"batch {batch}, sequence {sequence}", {k: expected[k] for k in actual}, actual, ATOL, RTOL)
            if not comparison.ok:
                raise Mismatch(comparison.summary())


TRACERS = {"fx": trace_fx, "export": trace_export, "hf_onnx": export_hf_onnx}


def build_end_to_end(model_type: str, class_name: str, frontend: str) -> None:
    """``aot build`` of a generated tiny recipe, in a temporary directory."""
    from aot.builder.spine import build

    from .recipe import tiny_recipe_text

    text = tiny_recipe_text(model_type, class_name, frontend, build_model(model_type, class_name))
    with tempfile.TemporaryDirectory(prefix="aot-coverage-") as directory:
        recipe = Path(directory) / f"{model_type}.yaml"
        recipe.write_text(text)
        try:
            report = build(recipe, Path(directory) / "out")
        except AotError as error:  # the same error, with paths from the output directory: no temporary names in the table
            raise type(error)(re.sub(re.escape(directory) + r"/(\.[^/\s]*/)?", "", str(error))) from None
        if not report.ok:  # build raises on a failed validation; this is the belt to those braces
            raise Mismatch(next(c.summary() for c in report.validation if not c.ok))
