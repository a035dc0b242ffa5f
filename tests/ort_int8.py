"""Whether ONNX Runtime's uint8 x int8 GEMM sums its products exactly on this CPU, measured once.

ONNX Runtime's MLAS, like fbgemm and oneDNN, multiplies uint8 by int8 on x86 without VNNI with ``VPMADDUBSW``,
which adds each neighbouring pair of products into a saturating int16 (see ``aot.runtime.int8_linear``'s
``_int8_vnni``). The int8 ONNX models feed ``MatMulInteger`` uint8 codes, so they compute the
documented formula exactly only where this holds; elsewhere the build's own validation and gates measure them.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

DEPTH = 64  # 32 neighbouring pairs


def saturating_product() -> np.ndarray:
    """``MatMulInteger`` of uint8 codes all 255 by int8 weights all 127, as ONNX Runtime computes it here."""
    weight = numpy_helper.from_array(np.full((DEPTH, 4), 127, np.int8), "W")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "W"], ["Y"])], "pairs",
                              [helper.make_tensor_value_info("A", TensorProto.UINT8, [2, DEPTH])],
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, [2, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"A": np.full((2, DEPTH), 255, np.uint8)})[0]


EXACT = 255 * 127 * DEPTH
SATURATED = 32767 * (DEPTH // 2)  # every pair clamped to int16's largest


@functools.cache
def ort_u8s8_sums_exact() -> bool:
    return bool((saturating_product() == EXACT).all())


def skip_unless_ort_u8s8_sums_exact() -> None:
    """Skip a test that compares ONNX Runtime's int8 sums with the formula where they saturate."""
    if not ort_u8s8_sums_exact():
        pytest.skip("ONNX Runtime's uint8 x int8 GEMM saturates on this CPU (no VNNI): see tests/ort_int8.py")
