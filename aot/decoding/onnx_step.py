"""An ONNX decoder-with-past model in ONNX Runtime, called as a flat step (for :func:`aot.decoding.greedy.greedy_generate`).

``OnnxStep(path)(input_ids, attention_mask, [position_ids,] *past) -> [logits, *present]``:
torch tensors in and out, fed to a plain ``onnxruntime.InferenceSession`` as numpy arrays by
the convention's names (:mod:`aot.decoding.names`). The model must have exactly those
inputs and outputs; its ``past_layout`` (heads, head size, dtype per layer) is read from
the model's past inputs, so a loop needs nothing but the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from .greedy import PastLayout
from .names import input_names, output_names

_PAST_KEY = re.compile(r"past_key_values\.(\d+)\.key")
_ONNX_TENSOR_TYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(double)": torch.float64}


class OnnxStep:
    """A decoder-with-past ONNX model as a step; see the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        session_options: ort.SessionOptions | None = None,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ):
        self.session = ort.InferenceSession(str(model_path), sess_options=session_options, providers=list(providers))
        inputs = {value.name: value for value in self.session.get_inputs()}
        num_layers = sum(1 for name in inputs if _PAST_KEY.fullmatch(name))
        with_position_ids = "position_ids" in inputs
        self.input_names = input_names(num_layers, with_position_ids)
        self.output_names = output_names(num_layers)
        _check_names(model_path, "inputs", self.input_names, list(inputs))
        _check_names(model_path, "outputs", self.output_names, [value.name for value in self.session.get_outputs()])
        self.past_layout = PastLayout(
            heads_and_dims=tuple(_heads_and_dim(inputs[f"past_key_values.{i}.key"], model_path) for i in range(num_layers)),
            dtype=_torch_dtype(inputs["past_key_values.0.key"], model_path) if num_layers else torch.float32,
            takes_position_ids=with_position_ids,
        )

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        if len(tensors) != len(self.input_names):
            raise ValueError(f"the ONNX step takes {len(self.input_names)} tensors ({', '.join(self.input_names)}), got {len(tensors)}")
        feed = {name: np.ascontiguousarray(tensor.detach().cpu().numpy()) for name, tensor in zip(self.input_names, tensors)}
        return [torch.from_numpy(array) for array in self.session.run(self.output_names, feed)]


def _check_names(model_path: str | Path, what: str, expected: list[str], found: list[str]) -> None:
    """The model's inputs or outputs are the convention's, in any order."""
    if sorted(expected) != sorted(found):
        missing = [name for name in expected if name not in found]
        unexpected = [name for name in found if name not in expected]
        raise ValueError(f"{model_path}: {what} are not a decoder-with-past's: missing {missing}, unexpected {unexpected}")


def _heads_and_dim(value, model_path: str | Path) -> tuple[int, int]:
    """``(kv_heads, head_dim)`` from a past input's shape (batch, kv_heads, past, head_dim), which must fix both."""
    shape = value.shape
    if len(shape) != 4 or not all(isinstance(size, int) for size in (shape[1], shape[3])):
        raise ValueError(f"{model_path}: input {value.name} has shape {shape}; expected (batch, kv_heads, past, head_dim) with fixed heads and head size")
    return shape[1], shape[3]


def _torch_dtype(value, model_path: str | Path) -> torch.dtype:
    if value.type not in _ONNX_TENSOR_TYPES:
        raise ValueError(f"{model_path}: input {value.name} is {value.type}; the past must be float, float16 or double")
    return _ONNX_TENSOR_TYPES[value.type]
