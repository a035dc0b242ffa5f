"""The recipe's ``optimize: transformer`` stage: ONNX Runtime's transformer optimizer on the written file.

``onnxruntime.transformers.optimizer.optimize_model`` runs with ``opt_level=0``
(its Python fusions only: attention, skip-layernorm, bias-gelu...; no ORT graph
optimisation, whose output depends on the machine); ``float16=True`` converts the
model after those fusions, which match float32 patterns. The model's files are
then replaced through the exporter's write path
(:func:`aot.export.onnx_files.write_checked`): checked, all or nothing. The head
count and hidden size come from the recipe's model config when it has them, else
the optimizer detects them from the graph.

This stage works on files because the optimizer does: it loads the weights whole.
``optimize: ort_fusions`` has no file-level stage: :func:`aot.export.write_onnx`
fuses in memory, before its one write.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

import onnx

from aot.errors import ExportError

from .onnx_export import EXTERNAL_DATA_THRESHOLD
from .onnx_files import step_errors, write_checked
from .ort_fusions import Target

logger = logging.getLogger(__name__)

# Hugging Face model_type -> the optimizer's model type (its fusions are per architecture family).
_MODEL_TYPES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "t5": "t5", "bart": "bart", "vit": "vit", "swin": "swin", "clip": "clip"}


def optimize_onnx(
    path: Path, level: str, model_spec: Any = None, target: Target = "cpu", float16: bool = False
) -> list[Path]:
    """Rewrite the model at ``path`` in place with the recipe's file-level ``optimize`` stage; return its files.

    ``level`` and ``target`` are the recipe's ``optimize`` and ``target``: ``transformer`` is the one
    level that works on files, and its fusions are the same for every target.
    """
    path = Path(path)
    if level != "transformer":
        raise ExportError(
            f"{path.name}: optimize: {level} has no file-level stage (ort_fusions runs in write_onnx, before the write)"
        )
    from onnxruntime.transformers import optimizer

    config = dict(getattr(model_spec, "config", None) or {})
    model_type = _MODEL_TYPES.get(str(config.get("model_type", "")), "bert")
    heads = int(config.get("num_attention_heads", config.get("n_head", 0)) or 0)
    hidden = int(config.get("hidden_size", config.get("n_embd", 0)) or 0)
    captured = io.StringIO()
    with step_errors(path, "ONNX Runtime's transformer optimizer fails"), contextlib.redirect_stdout(captured):
        optimized = optimizer.optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0)
        if float16:
            optimized.convert_float_to_float16(keep_io_types=True)
    logger.info("%s: transformer fusions %s", path.name, optimized.get_fused_operator_statistics())
    _drop_initializer_value_info(optimized.model)
    external = optimized.model.ByteSize() > EXTERNAL_DATA_THRESHOLD if _fits_protobuf(optimized.model) else True
    return write_checked(
        path, lambda staged: optimized.save_model_to_file(str(staged), use_external_data_format=external, all_tensors_to_one_file=True)
    )


def _drop_initializer_value_info(model: onnx.ModelProto) -> None:
    """Leave an initializer's type and shape to its tensor alone.

    The exporter (without its own optimiser) lists the initializers in ``value_info`` too. The
    optimizer transposes weights in place where it folds the exporter's Transpose nodes, and
    leaves those entries as they were: onnx.checker then rejects the model, whose MatMul weight
    is [32, 37] with a value_info that says [37, 32].
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    kept = [info for info in model.graph.value_info if info.name not in initializers]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _fits_protobuf(model: onnx.ModelProto) -> bool:
    try:
        model.ByteSize()
        return True
    except Exception:  # protobuf cannot even size a model over 2 GiB
        return False
