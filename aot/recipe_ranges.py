"""The sizes a recipe asks for, checked against each other and against the model's own limits.

A shape the recipe cannot mean (a validation shape outside its dim's range, a
sequence longer than the model's position table) is reported when the recipe
is loaded, or at the latest before any weight is built, naming the dim and the
line, instead of surfacing as a shape error deep in a trace or a validation
run. Nothing here needs torch or transformers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aot.recipe_yaml import Location

if TYPE_CHECKING:
    from aot.recipe import LoadedRecipe

POSITION_LIMIT_KEYS = ("max_position_embeddings", "n_positions")  # n_positions: GPT-2's name for it
"""Config keys for the longest sequence a model has position embeddings for, in the order looked up."""

ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")
"""Config keys of rotary position embeddings, computed from the positions on the fly: such a model's
max_position_embeddings is the length it was trained to, not the size of a table, so it is no limit."""

TOKEN_INPUT_SUFFIXES = ("input_ids", "inputs_embeds")
"""Inputs whose axis 1 is the sequence that position embeddings index (decoder_input_ids included)."""


def check_validation_shapes(loaded: LoadedRecipe) -> None:
    """Each ``validate.shapes`` entry names a dim, changes only dynamic ones, and stays in the dim's range."""
    dims = loaded.recipe.inputs.dims
    for index, shape in enumerate(loaded.recipe.validate_.shapes):
        for name, size in shape.items():
            location = ("validate", "shapes", index, name)
            dim = dims.get(name)
            if dim is None:
                raise loaded.error(location, f"no dim '{name}' under inputs.dims")
            if size != dim.size and not dim.dynamic:
                raise loaded.error(location, f"dim '{name}' is not dynamic, so it stays {dim.size}")
            if size < (dim.min or 1):
                raise loaded.error(location, f"{size} is below the min {dim.min or 1} of dim '{name}'")
            if dim.max is not None and size > dim.max:
                raise loaded.error(location, f"{size} is above the max {dim.max} of dim '{name}'")


def check_cuda_graph_buckets(loaded: LoadedRecipe) -> None:
    """``export.graph_module.cuda_graphs`` names dynamic dims, sizes within their ranges, and no decoder step."""
    buckets = loaded.recipe.export.graph_module.cuda_graphs
    if not buckets:
        return
    prefix = ("export", "graph_module", "cuda_graphs")
    if loaded.recipe.generation is not None and loaded.recipe.generation.cache:
        raise loaded.error(prefix, "a decoder step's past grows every call: CUDA graph buckets are for encoders")
    dims = loaded.recipe.inputs.dims
    for name, sizes in buckets.items():
        dim = dims.get(name)
        if dim is None or not dim.dynamic:
            raise loaded.error(prefix + (name,), f"'{name}' is no dynamic dim under inputs.dims")
        if not sizes:
            raise loaded.error(prefix + (name,), "name at least one size")
        for index, size in enumerate(sizes):
            if size < (dim.min or 1) or (dim.max is not None and size > dim.max):
                raise loaded.error(prefix + (name, index), f"{size} lies outside dim '{name}' ({dim.min or 1} to {dim.max or 'no maximum'})")


def shape_case_dims(loaded: LoadedRecipe) -> list[dict[str, int]]:
    """Every dim's size at each shape the build traces (the first) and validates, without repeats."""
    trace_dims = {name: dim.size for name, dim in loaded.recipe.inputs.dims.items()}
    cases = [trace_dims]
    for overrides in loaded.recipe.validate_.shapes or default_extra_shapes(loaded):
        dims = {**trace_dims, **overrides}
        if dims not in cases:
            cases.append(dims)
    return cases


def default_extra_shapes(loaded: LoadedRecipe) -> list[dict[str, int]]:
    """Without ``validate.shapes``: every dynamic dim at ``size // 2`` and ``2 * size - 1`` (3 for a size of 1), within its range."""
    dynamic = {name: dim for name, dim in loaded.recipe.inputs.dims.items() if dim.dynamic}
    if not dynamic:
        return []
    smaller, larger = {}, {}
    for name, dim in dynamic.items():
        low, high = dim.min or 1, dim.max or dim.size * 2
        smaller[name] = max(low, dim.size // 2, 1)
        larger[name] = min(high, dim.size * 2 - 1 if dim.size > 1 else 3)
    return [smaller, larger]


def check_position_limit(loaded: LoadedRecipe, config: Mapping[str, Any], source: str) -> None:
    """No sequence fed to ``input_ids``-like inputs may be longer than the config's position limit.

    ``config`` is the model's config as a mapping (config.json, or a transformers
    config's ``to_dict()``); ``source`` says where it came from, for the message.
    A config without such a key (relative positions, convolutions) has no limit,
    and neither has one with rotary embeddings or (DeBERTa) no absolute positions.
    """
    table = _position_table(config)
    if table is None:
        return
    key, limit = table
    for index, tensor in enumerate(loaded.recipe.inputs.tensors):
        if not tensor.name.endswith(TOKEN_INPUT_SUFFIXES) or len(tensor.shape) < 2:
            continue
        size, location, what = max(_sequence_sizes(loaded, index), key=lambda item: item[0])
        if size > limit:
            raise loaded.error(
                location,
                f"{what} is above the model's {key} {limit} ({source}): it is axis 1 of input '{tensor.name}'",
            )


def _sequence_sizes(loaded: LoadedRecipe, tensor_index: int) -> Iterator[tuple[int, Location, str]]:
    """Each size axis 1 of an input may take, with where the recipe asks for it and how to say so."""
    axis = loaded.recipe.inputs.tensors[tensor_index].shape[1]
    if isinstance(axis, int):
        yield axis, ("inputs", "tensors", tensor_index, "shape", 1), f"size {axis}"
        return
    dim = loaded.recipe.inputs.dims[axis]
    yield dim.size, ("inputs", "dims", axis, "size"), f"dim '{axis}' size {dim.size}"
    if dim.dynamic and dim.max is not None:
        yield dim.max, ("inputs", "dims", axis, "max"), f"dim '{axis}' max {dim.max}"
    requested = loaded.recipe.validate_.shapes
    for index, shape in enumerate(requested):
        if axis in shape:
            yield shape[axis], ("validate", "shapes", index, axis), f"validation shape {axis}={shape[axis]}"
    for shape in [] if requested else default_extra_shapes(loaded):
        if axis in shape:
            yield shape[axis], ("inputs", "dims", axis), f"default validation shape {axis}={shape[axis]} (set the dim's max)"


def _position_table(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """The config key and the size of the model's table of position embeddings, when it has one."""
    if any(config.get(rotary) is not None for rotary in ROTARY_KEYS) or config.get("position_biased_input") is False:
        return None
    return next(((key, config[key]) for key in POSITION_LIMIT_KEYS if _is_count(config.get(key))), None)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
