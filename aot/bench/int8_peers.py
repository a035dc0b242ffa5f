"""The int8 peers of ``aot bench --peers int8``: what other tools' dynamic quantisation makes of the model.

Dynamic quantisation stores the weights as int8 and quantises each activation when it is
used, from its own range (no calibration data). In outline (torch's activations use 7 bits, /127):

    x_q = round(x / s_x) + z_x,  s_x = (max(x, 0) - min(x, 0)) / 255     (uint8, per call)
    w_q = round(w / s_w),        s_w = max|w| / 127                      (int8, symmetric)
    x @ w ~= s_x * s_w * ((x_q - z_x) @ w_q)                             (int32 accumulation)

- ``ort_quantize_dynamic``: ONNX Runtime's ``quantize_dynamic`` on the TorchScript export, set
  as ``optimum-cli onnxruntime quantize --avx512_vnni`` sets it (see :func:`quantize_onnx_dynamic`);
- ``torch_ao_dynamic``: ``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear``
  (see :func:`quantize_torch_dynamic`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from aot.process.quiet import aot_debugging, quiet_torch


def quantize_onnx_dynamic(source: Path, target: Path) -> None:
    """``source`` (an fp32 ONNX model) dynamically quantised to int8 into ``target``, as Optimum does it.

    ``optimum-cli onnxruntime quantize --avx512_vnni`` builds
    ``AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)`` (per channel only
    with ``--per_channel``) and hands it to ONNX Runtime's ``ONNXQuantizer``: IntegerOps mode
    (``DynamicQuantizeLinear`` + ``MatMulInteger``), uint8 activations, int8 symmetric weights
    per tensor, full 8-bit range (``reduce_range=False``: VNNI does not saturate), every operator
    type of ONNX Runtime's ``IntegerOpsRegistry`` (MatMul, and Gemm made MatMul; Gather, whose
    embedding tables it stores as uint8; Attention, Conv, ...). ``quantize_dynamic`` with its
    defaults is that configuration but for one option: it quantises only the MatMuls whose B is
    a constant, where Optimum never sets ``MatMulConstBOnly`` and so also quantises attention's
    activation x activation MatMuls (Q @ K^T, P @ V). It is turned off here so that the peer is
    Optimum's model.

    Order: the quantiser runs on the plain export, with no ONNX Runtime transformer fusion first.
    ``optimum-cli onnxruntime quantize`` quantises the ONNX files it is given and optimises
    nothing; fusing first (``optimum-cli onnxruntime optimize``, whose ``Attention`` the
    quantiser would turn into ``QAttention``, as ONNX Runtime's docs advise) is a separate,
    optional command, so this peer is the one-command path.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _root_logger_records_dropped(), quiet_torch("a peer's quantisation"):
        quantize_dynamic(
            str(source), str(target), per_channel=False, reduce_range=False, weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": False},
        )


def quantize_torch_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` a ``torch.ao`` dynamic int8 Linear; ``model`` is left alone.

    The defaults of ``quantize_dynamic(..., {nn.Linear}, dtype=torch.qint8)``: int8 symmetric
    weights per tensor (MinMax), activations quantised per call to uint8 with ``reduce_range``
    (7 bits, which keeps x86's VPMADDUBSW from saturating), on this torch's default quantised
    engine (``torch.backends.quantized.engine``: ``x86`` on x86 CPUs, fbgemm's kernels, and
    ``qnnpack`` on ARM). Embeddings, LayerNorm and attention's matmuls stay fp32.
    """
    from torch.ao.quantization import quantize_dynamic

    # torch.ao.quantization warns that it is deprecated in favour of torchao (a separate package)
    # on every call; it is still torch's own dynamic quantisation, which is the peer. quiet_torch
    # ignores Python warnings unless aot logs at DEBUG.
    with quiet_torch("a peer's quantisation"):
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=False)


@contextlib.contextmanager
def _root_logger_records_dropped() -> Iterator[None]:
    """Drop, for the block, the records logged on the root logger itself, unless aot logs at DEBUG.

    ONNX Runtime's quantiser logs through ``logging.warning(...)`` and the like, on the root logger:
    "Please consider to run pre-processing before quantization" on every call. Through an
    application's handlers that reaches the terminal; with no handler on the root, those functions
    call ``logging.basicConfig()``, which leaves a library user's process a stderr handler for good
    (here one writing into quiet_torch's capture). So a handler-less root gets a NullHandler for the
    block, and the root gets a filter: a logger's filters see only the records logged on that logger,
    so aot's own records, which only pass through the root's handlers, still go through.
    """
    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None
    drop = None if aot_debugging() else _refuse
    if placeholder:
        root.addHandler(placeholder)
    if drop:
        root.addFilter(drop)
    try:
        yield
    finally:
        if drop:
            root.removeFilter(drop)
        if placeholder:
            root.removeHandler(placeholder)


def _refuse(record: logging.LogRecord) -> bool:
    return False
