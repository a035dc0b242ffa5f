"""Example inputs at every shape a build traces and validates.

A *shape case* binds each named dim of the recipe (batch, sequence, ...) to a
size. The first case is the trace-time one; the others come from
``validate.shapes`` or, when the recipe gives none, from the dynamic dims
(each at size // 2 and 2 * size - 1, within their bounds). Values are seeded
per case, so two builds see the same tensors.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aot.model_blueprint import check_forward_accepts
from aot.models import forward_parameters, load_tokenizer
from aot.recipe.plan import InputsPlan, ModelPlan
from aot.recipe.schema import TensorSpec



def text_lines(path: Path) -> list[str]:
    """A recipe's text file (data, prompts, calibration texts): its lines that are not blank, one text each."""
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

@dataclass
class ShapeCase:
    dims: dict[str, int]
    inputs: dict[str, torch.Tensor]

    @property
    def label(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self.dims.items()) or "static"


def check_input_names(plan: ModelPlan, model: torch.nn.Module) -> None:
    """The built model's forward takes every input the recipe names (a factory model has no earlier check)."""
    if plan.decoder_step:
        model = _decoder_step(model).causal_lm  # the step's inputs are made for it
    check_forward_accepts(plan, type(model).__name__, forward_parameters(model))


def dynamic_axes(plan: InputsPlan, model: torch.nn.Module | None = None) -> dict[str, dict[int, str]]:
    """``{input: {axis: dim name}}`` for every dynamic dim, the form ONNX and torch.export take.

    A decoder's KV-cache step (``generation.cache``; ``model`` is then the step) has its own.
    """
    if plan.decoder_step:
        return _decoder_step(model).dynamic_axes()
    dims = plan.spec.dims
    axes: dict[str, dict[int, str]] = {}
    for tensor in plan.spec.tensors:
        named = {axis: dim for axis, dim in enumerate(tensor.shape) if isinstance(dim, str) and dims[dim].dynamic}
        if named:
            axes[tensor.name] = named
    return axes


def onnx_input_names(plan: InputsPlan, model: torch.nn.Module) -> dict[str, str]:
    """``{input name: ONNX input name}`` where they differ: a decoder step's past (``past_key_values.0.key``)."""
    return _decoder_step(model).onnx_input_names() if plan.decoder_step else {}


def dim_ranges(plan: InputsPlan, model: torch.nn.Module | None = None) -> dict[str, tuple[int | None, int | None]]:
    if plan.decoder_step:
        return _decoder_step(model).dim_ranges()
    return {name: (dim.min, dim.max) for name, dim in plan.spec.dims.items() if dim.dynamic}


def texts_tokenizer(plan: InputsPlan) -> Any:
    """The tokenizer that encodes ``inputs.texts`` (the pretrained model's); None without texts."""
    if not plan.spec.texts:
        return None
    if plan.texts_tokenizer is None:
        raise plan.locator.error(("inputs", "texts"), "texts need a pretrained model directory that holds a tokenizer")
    return load_tokenizer(plan.texts_tokenizer)


def shape_cases(plan: InputsPlan, model: torch.nn.Module) -> list[ShapeCase]:
    if plan.decoder_step:
        step = _decoder_step(model)
        return [ShapeCase(dims=sizes, inputs=step.case_inputs(sizes, plan.seed + index)) for index, sizes in enumerate(step.check_sizes())]
    # load_recipe has checked validate.shapes against the dims.
    tokenizer = texts_tokenizer(plan)
    return [
        ShapeCase(dims=dims, inputs=make_inputs(plan, model, dims, seed=plan.seed + index, tokenizer=tokenizer))
        for index, dims in enumerate(plan.case_dims)
    ]


def _decoder_step(model: torch.nn.Module | None):
    from aot.decoding.keyword_step import DecoderStep

    if not isinstance(model, DecoderStep):
        raise TypeError(f"generation.cache builds a DecoderStep, not {type(model).__name__}")
    return model


def make_inputs(
    plan: InputsPlan, model: torch.nn.Module, dims: dict[str, int], seed: int, tokenizer: Any = None
) -> dict[str, torch.Tensor]:
    device = plan.device
    if tokenizer is not None:
        return _tokenized_inputs(plan, tokenizer, dims, device)
    generator = torch.Generator().manual_seed(seed)
    config = getattr(model, "config", None)
    return {
        tensor.name: _random_tensor(tensor, [dims[d] if isinstance(d, str) else d for d in tensor.shape], config, generator).to(device)
        for tensor in plan.spec.tensors
    }


def _random_tensor(spec: TensorSpec, shape: list[int], config: Any, generator: torch.Generator) -> torch.Tensor:
    values = _values(spec, shape, config, generator)
    if spec.last is not None:
        values[..., -1] = spec.last
    return values


def _values(spec: TensorSpec, shape: list[int], config: Any, generator: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    fill = spec.fill
    if fill == "random" and spec.low is None and spec.high is None and "mask" in spec.name:
        fill = "ones"  # a random padding mask can blank whole rows, which no real input does
    if fill == "ones":
        return torch.ones(shape, dtype=dtype)
    if fill == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator)
        if spec.low is not None or spec.high is not None:
            low, high = spec.low or 0.0, spec.high if spec.high is not None else 1.0
            values = torch.rand(shape, generator=generator) * (high - low) + low
        return values.to(dtype)
    low = int(spec.low or 0)
    high = int(spec.high) if spec.high is not None else _default_high(spec.name, config)
    return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)


def _default_high(name: str, config: Any) -> int:
    if name.endswith("input_ids") and getattr(config, "vocab_size", None):
        return int(config.vocab_size)
    if name == "token_type_ids":
        return int(getattr(config, "type_vocab_size", 1) or 1)
    if name.endswith("labels") and getattr(config, "num_labels", None):
        return int(config.num_labels)
    return 2


def _tokenized_inputs(plan: InputsPlan, tokenizer: Any, dims: dict[str, int], device: str) -> dict[str, torch.Tensor]:
    first = plan.spec.tensors[0]
    if len(first.shape) != 2 or not all(isinstance(d, str) for d in first.shape):
        raise plan.locator.error(("inputs", "tensors", 0, "shape"), "texts need inputs shaped [batch_dim, sequence_dim]")
    batch_dim, sequence_dim = first.shape
    texts = list(itertools.islice(itertools.cycle(plan.spec.texts), dims[batch_dim]))
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=dims[sequence_dim], return_tensors="pt")
    inputs = {}
    for index, tensor in enumerate(plan.spec.tensors):
        if tensor.name not in encoded:
            raise plan.locator.error(
                ("inputs", "tensors", index, "name"), f"the tokenizer gives no '{tensor.name}' (it gives: {', '.join(encoded)})"
            )
        inputs[tensor.name] = encoded[tensor.name].to(getattr(torch, tensor.dtype)).to(device)
    return inputs


__all__ = [
    "ShapeCase", "check_input_names", "dim_ranges", "dynamic_axes", "forward_parameters", "make_inputs", "onnx_input_names",
    "shape_cases", "texts_tokenizer",
]
