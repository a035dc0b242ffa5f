"""The sizes a recipe asks for, checked against each other and against the model's own limits.

A shape the recipe cannot mean (a validation shape outside its dim's range, a
sequence longer than the model's position table) is reported when the recipe
is loaded, or at the latest before any weight is built, naming the dim and the
line, instead of surfacing as a shape error deep in a trace or a validation
run. Nothing here needs torch or transformers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aot.recipe.locator import RecipeLocator
from aot.recipe.reader import Location
from aot.recipe.schema import DimSpec, GenerationSpec, InputsSpec, Recipe

POSITION_LIMIT_KEYS = ("max_position_embeddings", "n_positions")  # n_positions: GPT-2's name for it
"""Config keys for the longest sequence a model has position embeddings for, in the order looked up."""

ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")
"""Config keys of rotary position embeddings, computed from the positions on the fly: such a model's
max_position_embeddings is the length it was trained to, not the size of a table, so it is no limit."""

TOKEN_INPUT_SUFFIXES = ("input_ids", "inputs_embeds")
"""Inputs whose axis 1 is the sequence that position embeddings index (decoder_input_ids included)."""


@dataclass(frozen=True)
class SequenceDemand:
    """The longest sequence the build feeds the model's positions somewhere, with the recipe key that asks for it."""

    size: int
    location: Location
    what: str  # how the message says it: "dim 'sequence' max 512"
    fed_as: str  # where the build feeds it, for the message: "it is axis 1 of input 'input_ids'"


def check_validation_shapes(dims: Mapping[str, DimSpec], shapes: list[dict[str, int]], locator: RecipeLocator) -> None:
    """Each ``validate.shapes`` entry names a dim, changes only dynamic ones, and stays in the dim's range."""
    for index, shape in enumerate(shapes):
        for name, size in shape.items():
            location = ("validate", "shapes", index, name)
            dim = dims.get(name)
            if dim is None:
                raise locator.error(location, f"no dim '{name}' under inputs.dims")
            if size != dim.size and not dim.dynamic:
                raise locator.error(location, f"dim '{name}' is not dynamic, so it stays {dim.size}")
            if size < (dim.min or 1):
                raise locator.error(location, f"{size} is below the min {dim.min or 1} of dim '{name}'")
            if dim.max is not None and size > dim.max:
                raise locator.error(location, f"{size} is above the max {dim.max} of dim '{name}'")


def check_cuda_graph_buckets(
    buckets: dict[str, list[int]] | None, dims: Mapping[str, DimSpec], decoder_step: bool, locator: RecipeLocator
) -> None:
    """``export.graph_module.cuda_graphs`` names dynamic dims, sizes within their ranges, and no decoder step."""
    if not buckets:
        return
    prefix = ("export", "graph_module", "cuda_graphs")
    if decoder_step:
        raise locator.error(prefix, "a decoder step's past grows every call: CUDA graph buckets are for encoders")
    for name, sizes in buckets.items():
        dim = dims.get(name)
        if dim is None or not dim.dynamic:
            raise locator.error(prefix + (name,), f"'{name}' is no dynamic dim under inputs.dims")
        if not sizes:
            raise locator.error(prefix + (name,), "name at least one size")
        for index, size in enumerate(sizes):
            if size < (dim.min or 1) or (dim.max is not None and size > dim.max):
                raise locator.error(prefix + (name, index), f"{size} lies outside dim '{name}' ({dim.min or 1} to {dim.max or 'no maximum'})")


def shape_case_dims(dims: Mapping[str, DimSpec], shapes: list[dict[str, int]]) -> list[dict[str, int]]:
    """Every dim's size at each shape the build traces (the first) and validates, without repeats."""
    trace_dims = {name: dim.size for name, dim in dims.items()}
    cases = [trace_dims]
    for overrides in shapes or default_extra_shapes(dims):
        sizes = {**trace_dims, **overrides}
        if sizes not in cases:
            cases.append(sizes)
    return cases


def default_extra_shapes(dims: Mapping[str, DimSpec]) -> list[dict[str, int]]:
    """Without ``validate.shapes``: every dynamic dim at ``size // 2`` and ``2 * size - 1`` (3 for a size of 1), within its range."""
    dynamic = {name: dim for name, dim in dims.items() if dim.dynamic}
    if not dynamic:
        return []
    smaller, larger = {}, {}
    for name, dim in dynamic.items():
        low, high = dim.min or 1, dim.max or dim.size * 2
        smaller[name] = max(low, dim.size // 2, 1)
        larger[name] = min(high, dim.size * 2 - 1 if dim.size > 1 else 3)
    return [smaller, larger]


def recipe_sequence_demands(recipe: Recipe) -> list[SequenceDemand]:
    """Every sequence the recipe's build feeds the model: its token inputs' at each shape, and a decoder's generations."""
    return sequence_demands(recipe.inputs, recipe.validate_.shapes) + generation_demands(recipe.generation)


def sequence_demands(inputs: InputsSpec, shapes: list[dict[str, int]]) -> list[SequenceDemand]:
    """For each token input (``input_ids``-like, two axes or more), the longest sequence any shape feeds it."""
    demands = []
    for index, tensor in enumerate(inputs.tensors):
        if tensor.name.endswith(TOKEN_INPUT_SUFFIXES) and len(tensor.shape) >= 2:
            size, location, what = max(_sequence_sizes(inputs, shapes, index), key=lambda item: item[0])
            demands.append(SequenceDemand(size, location, what, f"it is axis 1 of input '{tensor.name}'"))
    return demands


def generation_length(prompt_tokens: int, new_tokens: int) -> int:
    """The positions a greedy generation feeds the model: the prompt, then each new token but the last (which is never
    fed back)."""
    return prompt_tokens + new_tokens - 1


def generation_demands(generation: GenerationSpec | None) -> list[SequenceDemand]:
    """The sequences a decoder step's build feeds it: each generation's prompt and then every new token but the last
    (the last is never fed back), ``generation.prompt_lengths`` with ``new_tokens`` and the fidelity gate's prompts with
    its own; and the calibration texts' prefills."""
    if generation is None or not generation.cache:
        return []  # no decoder step: nothing is generated
    new_tokens = generation.new_tokens
    demands = [
        SequenceDemand(
            generation_length(length, new_tokens),
            ("generation", "prompt_lengths", index),
            f"prompt length {length} + generation.new_tokens {new_tokens} - 1 = {generation_length(length, new_tokens)} tokens",
            "greedy generation feeds the prompt, then each new token but the last",
        )
        for index, length in enumerate(generation.prompt_lengths)
    ]
    calibration = generation.calibration
    if calibration is not None:  # its texts are prefilled, each cut to max_tokens
        demands.append(SequenceDemand(calibration.max_tokens, ("generation", "calibration", "max_tokens"),
                                      f"calibration.max_tokens {calibration.max_tokens}",
                                      "a pass fitting to the calibration texts prefills each, cut to that length"))
    fidelity = generation.fidelity
    if fidelity is not None:
        # The prompts file is tokenised only at build time: its prompts may all be shorter, but none is longer.
        size = generation_length(fidelity.max_prompt_tokens, fidelity.new_tokens)
        demands.append(SequenceDemand(
            size,
            ("generation", "fidelity", "max_prompt_tokens"),
            f"max_prompt_tokens {fidelity.max_prompt_tokens} + generation.fidelity.new_tokens {fidelity.new_tokens} - 1 = {size} tokens",
            "the fidelity gate generates new_tokens greedily after each prompt, cut to max_prompt_tokens",
        ))
    return demands


def check_position_limit(demands: list[SequenceDemand], config: Mapping[str, Any], source: str, locator: RecipeLocator) -> None:
    """No sequence the build feeds the model (``demands``) may be longer than the config's position limit.

    ``config`` is the model's config as a mapping (config.json, or a transformers
    config's ``to_dict()``); ``source`` says where it came from, for the message.
    A config without such a key (relative positions, convolutions) has no limit,
    and neither has one with rotary embeddings or (DeBERTa) no absolute positions.
    """
    table = position_table(config)
    if table is None:
        return
    key, limit = table
    for demand in demands:
        if demand.size > limit:
            raise locator.error(demand.location, f"{demand.what} is above the model's {key} {limit} ({source}): {demand.fed_as}")


def _sequence_sizes(inputs: InputsSpec, shapes: list[dict[str, int]], tensor_index: int) -> Iterator[tuple[int, Location, str]]:
    """Each size axis 1 of an input may take, with where the recipe asks for it and how to say so."""
    axis = inputs.tensors[tensor_index].shape[1]
    if isinstance(axis, int):
        yield axis, ("inputs", "tensors", tensor_index, "shape", 1), f"size {axis}"
        return
    dim = inputs.dims[axis]
    yield dim.size, ("inputs", "dims", axis, "size"), f"dim '{axis}' size {dim.size}"
    if dim.dynamic and dim.max is not None:
        yield dim.max, ("inputs", "dims", axis, "max"), f"dim '{axis}' max {dim.max}"
    for index, shape in enumerate(shapes):
        if axis in shape:
            yield shape[axis], ("validate", "shapes", index, axis), f"validation shape {axis}={shape[axis]}"
    for shape in [] if shapes else default_extra_shapes(inputs.dims):
        if axis in shape:
            yield shape[axis], ("inputs", "dims", axis), f"default validation shape {axis}={shape[axis]} (set the dim's max)"


def position_table(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """The config key and the size of the model's table of position embeddings, when it has one."""
    if any(config.get(rotary) is not None for rotary in ROTARY_KEYS) or config.get("position_biased_input") is False:
        return None
    return next(((key, config[key]) for key in POSITION_LIMIT_KEYS if _is_count(config.get(key))), None)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
