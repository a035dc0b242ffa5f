"""ONNX-level optimisation of a written ONNX file, in place and atomically.

``level="ort_fusions"``: :func:`aot.export.ort_fusions.fuse_for_ort`, the fusions
into ONNX Runtime's contrib ops (MultiHeadAttention, BiasGelu; on CPU the feed-forward
blocks split in two and the norms fed from a Sum, on CUDA SkipLayerNormalization). The
build runs the same fusions in memory before its one write (``write_onnx(...,
ort_fusions=target)``); this entry point is for files. ``float16=True`` converts the
model after the fusions, at any level (:mod:`aot.export.onnx_float16`).

``level="transformer"`` runs ``onnxruntime.transformers.optimizer.optimize_model``
with ``opt_level=0`` (its Python fusions only: attention, skip-layernorm,
bias-gelu...; no ORT graph optimisation, whose output depends on the machine),
then rewrites the model file in place, atomically. The head count and hidden
size come from the recipe's model config when it has them, else the optimizer
detects them from the graph. ``level="none"`` does nothing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import onnx

from aot.errors import ExportError

from .onnx_export import EXTERNAL_DATA_THRESHOLD
from .onnx_float16 import convert_to_float16
from .ort_fusions import Target, fuse_for_ort

logger = logging.getLogger(__name__)

# Hugging Face model_type -> the optimizer's model type (its fusions are per architecture family).
_MODEL_TYPES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "t5": "t5", "bart": "bart", "vit": "vit", "swin": "swin", "clip": "clip"}


def optimize_onnx(
    path: Path, level: str, model_spec: Any = None, target: Target = "cpu", float16: bool = False
) -> list[Path]:
    """Rewrite the model at ``path`` in place; ``float16`` converts it after the fusions."""
    path = Path(path)
    if level == "none" and not float16:
        return [path]
    if level in ("none", "ort_fusions"):
        return _ort_fusions(path, target if level == "ort_fusions" else None, float16)
    if level != "transformer":
        raise ExportError(f"ONNX optimisation level {level!r} is not one of: none, ort_fusions, transformer")
    from onnxruntime.transformers import optimizer

    config = dict(getattr(model_spec, "config", None) or {})
    model_type = _MODEL_TYPES.get(str(config.get("model_type", "")), "bert")
    heads = int(config.get("num_attention_heads", config.get("n_head", 0)) or 0)
    hidden = int(config.get("hidden_size", config.get("n_embd", 0)) or 0)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            optimized = optimizer.optimize_model(
                str(path), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0
            )
            if float16:
                optimized.convert_float_to_float16(keep_io_types=True)
    except Exception as error:
        raise ExportError(f"{path.name}: ONNX Runtime's transformer optimizer fails: {type(error).__name__}: {error}") from None
    logger.info("%s: transformer fusions %s", path.name, optimized.get_fused_operator_statistics())
    external = optimized.model.ByteSize() > EXTERNAL_DATA_THRESHOLD if _fits_protobuf(optimized.model) else True
    return _replace_checked(
        path, lambda staged: optimized.save_model_to_file(str(staged), use_external_data_format=external, all_tensors_to_one_file=True)
    )


def _ort_fusions(path: Path, target: Target | None, float16: bool) -> list[Path]:
    import onnx_ir as ir

    data_file = path.parent / f"{path.name}.data"
    external = data_file.is_file()
    try:
        model = ir.load(str(path))
        if target is not None:
            fuse_for_ort(model, target)
    except Exception as error:
        raise ExportError(f"{path.name}: ONNX Runtime fusions fail: {type(error).__name__}: {error}") from None
    if float16:
        try:
            model = convert_to_float16(ir.external_data.load_to_model(model))
        except Exception as error:
            raise ExportError(f"{path.name}: float16 conversion fails: {type(error).__name__}: {error}") from None
    return _replace_checked(path, lambda staged: ir.save(model, str(staged), external_data=data_file.name if external else None))


def _replace_checked(path: Path, write: Callable[[Path], None]) -> list[Path]:
    """``write`` the new model into a staging directory, check it, then move its files over ``path``'s."""
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = staging / path.name
        write(staged)
        try:
            onnx.checker.check_model(str(staged), full_check=True)
        except Exception as error:
            raise ExportError(f"{path.name}: onnx.checker rejects the optimised model: {str(error).splitlines()[0]}") from None
        written = []
        for produced in sorted(staging.iterdir()):
            os.replace(produced, path.parent / produced.name)
            written.append(path.parent / produced.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [path] + [item for item in written if item != path]


def _fits_protobuf(model: onnx.ModelProto) -> bool:
    try:
        model.ByteSize()
        return True
    except Exception:  # protobuf cannot even size a model over 2 GiB
        return False
