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
from typing import Any

import torch

from aot.model_blueprint import check_forward_accepts
from aot.models import forward_parameters, load_tokenizer
from aot.recipe import LoadedRecipe, is_decoder_with_cache
from aot.recipe_ranges import shape_case_dims
from aot.recipe_schema import TensorSpec


@dataclass
class ShapeCase:
    dims: dict[str, int]
    inputs: dict[str, torch.Tensor]

    @property
    def label(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self.dims.items()) or "static"


def check_input_names(loaded: LoadedRecipe, model: torch.nn.Module) -> None:
    """The built model's forward takes every input the recipe names (a factory model has no earlier check)."""
    if is_decoder_with_cache(loaded):
        model = _decoder_step(loaded, model).causal_lm  # the step's inputs are made for it
    check_forward_accepts(loaded, type(model).__name__, forward_parameters(model))


def dynamic_axes(loaded: LoadedRecipe, model: torch.nn.Module | None = None) -> dict[str, dict[int, str]]:
    """``{input: {axis: dim name}}`` for every dynamic dim, the form ONNX and torch.export take.

    A decoder's KV-cache step (``generation.cache``; ``model`` is then the step) has its own.
    """
    if is_decoder_with_cache(loaded):
        return _decoder_step(loaded, model).dynamic_axes()
    dims = loaded.recipe.inputs.dims
    axes: dict[str, dict[int, str]] = {}
    for tensor in loaded.recipe.inputs.tensors:
        named = {axis: dim for axis, dim in enumerate(tensor.shape) if isinstance(dim, str) and dims[dim].dynamic}
        if named:
            axes[tensor.name] = named
    return axes


def onnx_input_names(loaded: LoadedRecipe, model: torch.nn.Module) -> dict[str, str]:
    """``{input name: ONNX input name}`` where they differ: a decoder step's past (``past_key_values.0.key``)."""
    return _decoder_step(loaded, model).onnx_input_names() if is_decoder_with_cache(loaded) else {}


def dim_ranges(loaded: LoadedRecipe, model: torch.nn.Module | None = None) -> dict[str, tuple[int | None, int | None]]:
    if is_decoder_with_cache(loaded):
        return _decoder_step(loaded, model).dim_ranges()
    return {name: (dim.min, dim.max) for name, dim in loaded.recipe.inputs.dims.items() if dim.dynamic}


def shape_cases(loaded: LoadedRecipe, model: torch.nn.Module) -> list[ShapeCase]:
    if is_decoder_with_cache(loaded):
        step = _decoder_step(loaded, model)
        seed = loaded.recipe.model.seed
        return [ShapeCase(dims=sizes, inputs=step.case_inputs(sizes, seed + index)) for index, sizes in enumerate(step.check_sizes())]
    # load_recipe has checked validate.shapes against the dims.
    texts_tokenizer = load_tokenizer(loaded) if loaded.recipe.inputs.texts else None
    return [
        ShapeCase(dims=dims, inputs=make_inputs(loaded, model, dims, seed=loaded.recipe.model.seed + index, tokenizer=texts_tokenizer))
        for index, dims in enumerate(shape_case_dims(loaded))
    ]


def _decoder_step(loaded: LoadedRecipe, model: torch.nn.Module | None):
    from aot.decoding.keyword_step import DecoderStep

    if not isinstance(model, DecoderStep):
        raise TypeError(f"{loaded.path}: generation.cache builds a DecoderStep, not {type(model).__name__}")
    return model


def make_inputs(
    loaded: LoadedRecipe, model: torch.nn.Module, dims: dict[str, int], seed: int, tokenizer: Any = None
) -> dict[str, torch.Tensor]:
    device = loaded.recipe.model.device
    if tokenizer is not None:
        return _tokenized_inputs(loaded, tokenizer, dims, device)
    generator = torch.Generator().manual_seed(seed)
    config = getattr(model, "config", None)
    return {
        tensor.name: _random_tensor(tensor, [dims[d] if isinstance(d, str) else d for d in tensor.shape], config, generator).to(device)
        for tensor in loaded.recipe.inputs.tensors
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


def _tokenized_inputs(loaded: LoadedRecipe, tokenizer: Any, dims: dict[str, int], device: str) -> dict[str, torch.Tensor]:
    first = loaded.recipe.inputs.tensors[0]
    if len(first.shape) != 2 or not all(isinstance(d, str) for d in first.shape):
        raise loaded.error(("inputs", "tensors", 0, "shape"), "texts need inputs shaped [batch_dim, sequence_dim]")
    batch_dim, sequence_dim = first.shape
    texts = list(itertools.islice(itertools.cycle(loaded.recipe.inputs.texts), dims[batch_dim]))
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=dims[sequence_dim], return_tensors="pt")
    inputs = {}
    for index, tensor in enumerate(loaded.recipe.inputs.tensors):
        if tensor.name not in encoded:
            raise loaded.error(
                ("inputs", "tensors", index, "name"), f"the tokenizer gives no '{tensor.name}' (it gives: {', '.join(encoded)})"
            )
        inputs[tensor.name] = encoded[tensor.name].to(getattr(torch, tensor.dtype)).to(device)
    return inputs


__all__ = ["ShapeCase", "check_input_names", "dim_ranges", "dynamic_axes", "forward_parameters", "make_inputs", "onnx_input_names", "shape_cases"]
