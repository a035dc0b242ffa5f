"""Run an exported ONNX model in ONNX Runtime, with outputs named as the graph names them.

The exported model's output names are :func:`aot.tracing.outputs.flatten_outputs`
names, so the result compares key by key with the eager model's flattened
outputs. CUDA is used where ONNX Runtime has it, CPU otherwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import torch

from aot.errors import ExportError


def default_providers() -> list[str]:
    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def run_onnx(
    path: Path,
    inputs: dict[str, torch.Tensor | np.ndarray],
    providers: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run the model at ``path`` on ``inputs`` (extra inputs are ignored); return ``{output name: array}``."""
    path = Path(path)
    session = _session(path, tuple(providers or default_providers()))
    feed = {}
    for declared in session.get_inputs():
        if declared.name not in inputs:
            raise ExportError(f"{path.name}: input '{declared.name}' is missing (given: {', '.join(inputs)})")
        feed[declared.name] = _as_array(inputs[declared.name])
    names = [output.name for output in session.get_outputs()]
    try:
        results = session.run(names, feed)
    except Exception as error:
        raise ExportError(f"{path.name}: ONNX Runtime fails to run the model: {str(error).splitlines()[0]}") from None
    return dict(zip(names, results))


def _session(path: Path, providers: tuple[str, ...]) -> onnxruntime.InferenceSession:
    """One session per file version: validation runs a model at several shapes, and loading dominates."""
    try:
        stat = path.stat()
    except OSError as error:
        raise ExportError(f"{path}: cannot read the ONNX model: {error}") from None
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, providers)
    cached = _SESSIONS.get(key)
    if cached is not None:
        return cached
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT's warnings go to stderr, which library code must not use
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=list(providers))
    except Exception as error:
        raise ExportError(f"{path}: ONNX Runtime cannot load the model: {str(error).strip().splitlines()[0]}") from None
    _SESSIONS.clear()  # keep one model in memory at a time
    _SESSIONS[key] = session
    return session


_SESSIONS: dict[tuple, onnxruntime.InferenceSession] = {}


def release_sessions() -> None:
    """Drop the cached session, and the copy of the weights ONNX Runtime holds in it."""
    _SESSIONS.clear()


def _as_array(value: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(value)
