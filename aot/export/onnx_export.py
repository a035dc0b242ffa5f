"""Export a GraphModule to ONNX with the torch.onnx dynamo exporter, checked and reproducible.

- Dynamic axes: the recipe's ``{input: {axis: dim_name}}`` is handed to the
  exporter as strings, which it turns into ``Dim.DYNAMIC`` and then renames the
  ONNX symbolic dimensions after (``batch``, ``sequence``). An axis the exporter
  specialised to a number anyway is an error, not a silently static model.
- Output names are :func:`aot.tracing.outputs.flatten_outputs` names of the graph's output.
- Weights go to one external data file ``<name>.data`` beside the model when
  the model would pass protobuf's 2 GiB limit.
- The ONNX unit's own lowering passes run before the exporter (``aot.runtime.Int8DynamicLinear`` layers become ONNX's
  int8 ops, ``aot.runtime.WeightOnlyLinear`` layers ONNX Runtime's ``MatMulNBits``...) and after it, on the model it
  made; each is named, and what each did is recorded (:mod:`aot.export.onnx_lowering`).
- The exporter decomposes the nodes ONNX has no translation for one by one, not by tracing
  the whole program a second time (:mod:`aot.export.onnx_decompositions`).
- Reproducible: node stack traces (file paths, line numbers) are dropped; nothing
  else the exporter writes varies between two exports of the same graph.
- Written all or nothing and checked (``onnx.checker``, full check) by
  :func:`aot.export.onnx_files.write_checked`, the file-level optimiser's write path too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
import torch.fx

from aot.compat.torch_private import ONNX_REGISTRATION_LOGGER, fx_code_without_stack_traces
from aot.errors import ExportError, first_line
from aot.process.quiet import quiet_torch
from aot.tracing.export_trace import INFERRED
from aot.tracing.source_location import raised_at
from aot.tracing.outputs import flatten_outputs

from .export_shapes import dynamic_shapes_of, ordered_inputs
from .onnx_decompositions import only_needed_decompositions
from .onnx_files import step_errors, write_checked
from .onnx_float16 import convert_to_float16
from .onnx_lowering import LoweringContext, run_lowering
from .ort_fusions import Target, fuse_for_ort

logger = logging.getLogger(__name__)

EXTERNAL_DATA_THRESHOLD = 2 * 1024**3 - 64 * 1024**2  # bytes of weights; protobuf refuses files over 2 GiB
_DROPPED_NODE_METADATA = ("pkg.torch.onnx.stack_trace",)
# A function the traced code calls (torch.sym_min in Mistral's sliding window) enters the module stack
# the exporter records as its repr, "<function sym_min at 0x7f16f063e480>": an address that differs
# in every process.
_OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
_WRITE_THREADS = 2


@dataclass
class OnnxArtifact:
    paths: list[Path]
    fusions: dict[str, int] = field(default_factory=dict)
    lowering: list[dict[str, Any]] = field(default_factory=list)  # what each lowering pass did (onnx_lowering), in order


def write_onnx(
    gm: torch.fx.GraphModule,
    path: Path,
    example_inputs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, str]] | None,
    opset: int = 18,
    *,
    optimize: bool = True,
    external_data: bool | None = None,
    ort_fusions: Target | None = None,
    output_names: list[str] | None = None,
    dim_ranges: dict[str, tuple[int | None, int | None]] | None = None,
    float16: bool = False,
    input_names: dict[str, str] | None = None,
    int8_prompts: bool = False,
) -> OnnxArtifact:
    """Write ``path`` (and ``path.data`` for large models); return the written paths, the fusions made and what the
    lowering passes did (:mod:`aot.export.onnx_lowering`).

    ``external_data``: ``True`` always writes the weights to ``<name>.data`` (on BERT-base it
    halves the export's peak memory and saves ~4 s, since no 400 MB protobuf is built in
    memory), ``False`` never does, ``None`` does only past protobuf's 2 GiB limit.

    ``optimize`` runs the exporter's onnxscript optimiser (constant folding, Conv+BatchNormalization
    folding...): about 2 s of the ~15 s a BERT-base export takes on two cores; ONNX Runtime folds
    constants itself when it loads a model, so turning it off costs load time, not correctness.

    ``ort_fusions`` (``"cpu"`` or ``"cuda"``) fuses the graph into ONNX Runtime's contrib ops for that
    target (:mod:`aot.export.ort_fusions`) in memory, before the one write: the weights are written
    once and never read back.

    The exporter and onnxscript's rewrite rules keep references to the exported graph, and
    through it to ``gm``'s weights, after this returns (module-level pattern matchers keep their
    last match; a graph's input bookkeeping keeps the weights it once listed as inputs). The
    build therefore calls this in a forked child (:mod:`aot.process.forked`).

    ``output_names``: the :func:`aot.tracing.outputs.flatten_outputs` names of the graph's outputs, when
    the caller has them; otherwise the graph is run once to find them.

    ``float16``: convert the model to float16 arithmetic after the fusions (which match float32
    patterns), its float32 inputs and outputs kept (:mod:`aot.export.onnx_float16`).

    ``input_names``: ``{graph input: ONNX name}`` for inputs whose ONNX name is no Python
    identifier (a decoder's ``past_key_values.0.key``, which the graph takes as ``past_key_values_0_key``).

    ``int8_prompts``: int4 weight-only layers run calls of more rows than a decode step through ONNX
    Runtime's int8 GEMM on an int8 copy of their weights (:mod:`aot.export.onnx_prompt_gemm`).

    ``dim_ranges``: ``{dim name: (min, max)}`` for the dynamic dims. With them each dim is one
    ``torch.export.Dim`` shared by every input that has it, bounded as the recipe says, so the
    exporter need not prove that the inputs' batch sizes agree (BERT-base: a few tenths of a
    second of a ~9 s export). It is no check of the range: the exporter turns the conditions it
    cannot prove into runtime asserts, and then drops them from the ONNX graph.
    """
    path = Path(path)
    inputs = ordered_inputs(gm, example_inputs)
    output_names = output_names or _output_names(gm, inputs)
    dynamic_shapes = dynamic_shapes_of(inputs, dynamic_dims, dim_ranges) if dynamic_dims else None
    lowering = LoweringContext(int8_prompts=int8_prompts, input_names=input_names or {})
    gm, lowered_graph = run_lowering("fx", gm, lowering)
    program = _run_exporter(gm, path, inputs, dynamic_shapes, output_names, opset, optimize, lowering.translations)
    produced_opset = program.model.opset_imports.get("", None)
    if produced_opset != opset:
        raise ExportError(
            f"{path.name}: opset {opset} was asked for but the exporter produced opset {produced_opset}"
            " (its version converter could not convert this graph)"
        )
    inferred = {name for name, bounds in (dim_ranges or {}).items() if bounds == INFERRED}
    _check_dynamic_axes(program.model, dynamic_dims or {}, path, inferred)  # under the graph's input names
    program.model, lowered_model = run_lowering("onnx", program.model, lowering)
    _drop_unreproducible_metadata(program.model)
    fusions = {}
    if ort_fusions is not None:
        with step_errors(path, "ONNX Runtime fusions fail"):
            fusions = fuse_for_ort(program.model, ort_fusions)
    if float16:
        with step_errors(path, "float16 conversion fails"):
            program.model = convert_to_float16(program.model)
    external = _weight_bytes(program.model) > EXTERNAL_DATA_THRESHOLD if external_data is not True else True
    if external and external_data is False:
        raise ExportError(f"{path.name}: the weights pass protobuf's 2 GiB limit, so they must go to external data")
    _contiguous_on_write(program.model)
    written = write_checked(path, lambda staged: _save(program.model, staged, external))
    logger.info("exported %s (opset %d, external data: %s)", path, opset, external)
    return OnnxArtifact(written, fusions, [record.to_json() for record in lowered_graph + lowered_model])


def _output_names(gm: torch.fx.GraphModule, inputs: dict[str, torch.Tensor]) -> list[str]:
    try:
        with torch.no_grad():
            return list(flatten_outputs(gm(**inputs)))
    except Exception as error:
        raise ExportError(f"the graph does not run on the example inputs: {type(error).__name__}: {first_line(error)}")


@contextlib.contextmanager
def quiet_exporter_logs():
    """The exporter logs warnings about optional torchvision ops on every call; they are noise here."""
    registration = logging.getLogger(ONNX_REGISTRATION_LOGGER)
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        yield
    finally:
        registration.setLevel(level)


def _run_exporter(gm, path, inputs, dynamic_shapes, output_names, opset, optimize, translations):
    try:
        # Quieted here, not by the caller: the build runs this in a forked child, whose stderr is
        # the terminal. quiet_torch comes second, so that it holds the registration logger too.
        with (
            quiet_exporter_logs(),
            quiet_torch("torch.onnx.export"),
            # No Python stack trace recorded per node: the ONNX file drops them (_DROPPED_NODE_METADATA: file
            # paths and line numbers), and symbolising them was a second of BERT-base's export on two cores.
            # Errors keep their own tracebacks, which is what _exporter_reason reads.
            fx_code_without_stack_traces(),
            only_needed_decompositions(),  # not a second trace of the whole program
        ):
            program = torch.onnx.export(
                gm,
                (),
                kwargs=inputs,
                dynamic_shapes=dynamic_shapes,
                output_names=output_names,
                opset_version=opset,
                dynamo=True,
                custom_translation_table=translations or None,
                external_data=True,
                optimize=optimize,
                verify=False,
                report=False,
                verbose=False,
            )
    except Exception as error:
        raise ExportError(f"torch.onnx.export rejects the graph for {path.name}: {_exporter_reason(error)}") from None
    return program


def _exporter_reason(error: BaseException) -> str:
    """The innermost cause names the op at fault; the exporter's own messages are long reports.

    Where that cause was raised in model code (a leaf module's ``forward`` that torch.export
    traces into), the line is named too.
    """
    chain = []
    while error is not None and len(chain) < 20:
        chain.append(error)
        error = error.__cause__ or error.__context__
    innermost = chain[-1]
    location = raised_at(innermost)
    where = f" at {location}" if location is not None else ""
    return f"{type(innermost).__name__}{where}: {first_line(innermost)}"


def _check_dynamic_axes(model, dynamic_dims: dict[str, dict[int, str]], path: Path, inferred: set[str] = frozenset()) -> None:
    """Every dynamic axis came out dynamic, under its name (an ``inferred`` dim under the exporter's expression)."""
    graph_inputs = {value.name: value for value in model.graph.inputs}
    for name, axes in dynamic_dims.items():
        value = graph_inputs.get(name)
        if value is None:
            continue  # the exporter dropped an unused input
        for axis, dim_name in axes.items():
            dim = value.shape[axis]
            if isinstance(dim, int) or (dim_name not in inferred and getattr(dim, "value", None) != dim_name):
                raise ExportError(
                    f"{path.name}: axis {axis} of input '{name}' came out as {dim!r}, not the dynamic dim '{dim_name}'"
                    " (an example size of 0 or 1 makes torch.export specialise it; use an example of size >= 2)"
                )


def _drop_unreproducible_metadata(model: ir.Model) -> None:
    """Stack traces go (they name this machine's paths); object addresses in what stays are cut out."""
    for graph in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for key in _DROPPED_NODE_METADATA:
                node.metadata_props.pop(key, None)
            for key, value in node.metadata_props.items():
                if " at 0x" in value:
                    node.metadata_props[key] = _OBJECT_ADDRESS.sub(">", value)


def _contiguous_on_write(model) -> None:
    """Have strided initializers copied to row-major order one at a time, as they are written.

    The exporter's MatMul weights are transposed numpy views of the torch weights. numpy writes
    a non-contiguous array to a file element by element: 1.4 s of BERT-base's 1.7 s save, where a
    copy to row-major order and one write take 0.3 s. Copying them all up front would hold a
    second copy of every weight at once; a lazy tensor holds one at a time.
    """
    for value in model.graph.initializers.values():
        tensor = value.const_value
        array = getattr(tensor, "raw", None)
        if isinstance(tensor, ir.Tensor) and isinstance(array, np.ndarray) and not array.flags.c_contiguous:
            value.const_value = ir.LazyTensor(
                functools.partial(_row_major, tensor), dtype=tensor.dtype, shape=tensor.shape, name=tensor.name
            )


def _save(model, path: Path, external: bool) -> None:
    """``model`` to ``path``, its weights to ``<name>.data`` beside it when ``external``.

    The weights are copied to row-major order and written by two threads at offsets laid out
    before any is written (onnx_ir's ``max_workers``), so the file's bytes are those of a serial
    write. The copies and the writes run outside the GIL: on BERT-base's 418 MB, two threads
    took 0.69 s where one took 1.03 s (AMD EPYC), with the build's other core free while its
    forked export writes.
    """
    if external:
        ir.save(model, str(path), external_data=f"{path.name}.data", max_workers=_WRITE_THREADS)
    else:
        ir.save(model, str(path))


def _row_major(tensor) -> ir.Tensor:
    return ir.Tensor(np.ascontiguousarray(tensor.raw), dtype=tensor.dtype, name=tensor.name)


def _weight_bytes(model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total
