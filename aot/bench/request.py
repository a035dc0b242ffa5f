"""What ``aot bench`` is asked to time, checked against the build before any runner starts.

A size the build was never checked for fails deep inside a runner (an empty batch, an index past the model's
position table) after the others have run, or is timed silently outside the artifacts' dynamic range; a peer the
build cannot have shows only as a failure after the run. :func:`check_request` refuses each in one line (a
:class:`~aot.errors.RecipeError`: exit 2), from the build's plan alone:

- the grid (``-s DIM=SIZE``): dims the build has, each size checked as the recipe's own validation shapes are
  (:func:`aot.recipe.ranges.check_validation_shapes`: a static dim keeps its size, a dynamic one stays within its
  min and max, and no size is below 1), and a token input's sequence within the model's position table
  (:func:`aot.recipe.ranges.check_position_limit`);
- a decoder build's dims are the bench's own (:data:`DECODER_DIMS`: ``batch`` rows of ``prompt`` tokens), and each
  prompt with the ``--new-tokens`` fed back after it stays within the model's positions, as ``aot run`` checks a
  generation (:func:`aot.recipe.ranges.generation_length` against :func:`aot.recipe.ranges.position_table`);
- ``--new-tokens``: a decoder's option, at least 2;
- the peers: a decoder build takes only the decoder peers and a CUDA build only the CUDA ones, even through a group;
  a peer that needs what this build has not (CUDA graph buckets, a pretrained checkpoint to convert) is refused when
  named, and skipped with a note when a group named it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aot.bench.peer_groups import BUILD_PEERS, CHECKPOINT_PEERS, CUDA_PEERS, DECODER_PEERS, expand_peers, without_checkpoint
from aot.errors import RecipeError
from aot.recipe.plan import BuildPlan
from aot.recipe.ranges import check_position_limit, check_validation_shapes, generation_length, position_table, sequence_demands
from aot.recipe.reader import Location
from aot.recipe.schema import DimSpec

# A decoder build's dims, the bench's own: rows, and prompt tokens (its step takes any of each).
DECODER_DIMS = {"batch": DimSpec(size=1, dynamic=True, min=1), "prompt": DimSpec(size=32, dynamic=True, min=1)}
DEFAULT_NEW_TOKENS = 32


@dataclass(frozen=True)
class BenchRequest:
    """A bench the build can take: its shapes, the peers to time, and what a decoder's generations make."""

    shapes: list[dict[str, int]]
    peers: tuple[str, ...]
    new_tokens: int
    skipped_peers: dict[str, str] = field(default_factory=dict)  # a group's member this build cannot have, and why


def check_request(
    plan: BuildPlan, grid: dict[str, list[int]] | None = None, peers: tuple[str, ...] = (), new_tokens: int | None = None
) -> BenchRequest:
    """``grid`` (``-s``), ``peers`` (peers' names and groups) and ``new_tokens`` (None: not given) checked against
    ``plan``; a RecipeError names the option at fault."""
    grid = grid or {}
    shapes = grid_shapes(plan, grid)
    decoder = plan.model.decoder_step
    if new_tokens is not None and not decoder:
        raise RecipeError(f"--new-tokens {new_tokens}: applies to a decoder build (generation.cache), not to this one, "
                          "whose runners are timed a call at a time")
    new_tokens = DEFAULT_NEW_TOKENS if new_tokens is None else new_tokens
    if decoder and new_tokens < 2:
        raise RecipeError(f"--new-tokens {new_tokens}: a decode time needs at least 2 tokens")
    entries = [{name: size} for name, sizes in grid.items() for size in sizes]
    dims = bench_dims(plan)
    check_validation_shapes(dims, entries, _GridOption(entries, dims))
    if decoder:
        _check_generation_positions(plan, shapes, "prompt" in grid, new_tokens)
    elif entries:  # the build checked its own sizes against the positions; these are the bench's
        _check_sequence_positions(plan, entries)
    kept, skipped = _fitting_peers(plan, peers)
    return BenchRequest(shapes, kept, new_tokens, skipped)


def bench_dims(plan: BuildPlan) -> Mapping[str, DimSpec]:
    """The dims a bench of ``plan``'s build takes: the recipe's, or a decoder's :data:`DECODER_DIMS`."""
    return DECODER_DIMS if plan.model.decoder_step else plan.inputs.spec.dims


def grid_shapes(plan: BuildPlan, grid: dict[str, list[int]]) -> list[dict[str, int]]:
    """Every shape of the grid: each dim at its sizes in ``grid``, else at its trace size, in every combination."""
    dims = {name: [dim.size] for name, dim in bench_dims(plan).items()}
    for name, sizes in grid.items():
        if name not in dims:
            raise RecipeError(f"--shape {name}=...: the recipe has no dim '{name}' (it has: {', '.join(dims)})")
        dims[name] = sizes
    names = list(dims)
    return [dict(zip(names, sizes)) for sizes in itertools.product(*(dims[n] for n in names))]


class _GridOption:
    """Stands for the recipe's locator in its range checks (:mod:`aot.recipe.ranges`), which then name ``-s DIM=SIZE``
    instead of a recipe key: to them, the grid's ``entries[i]`` is ``validate.shapes[i]``."""

    def __init__(self, entries: list[dict[str, int]], dims: Mapping[str, DimSpec] | None = None):
        self.entries = entries
        self.dims = dims or {}  # given: the message says what the dim takes

    def error(self, location: Location, message: str) -> RecipeError:
        if location[:2] != ("validate", "shapes"):  # a size of the recipe's own, which the build checked
            return RecipeError(message)
        name = str(location[3])
        size = self.entries[int(location[2])][name]
        dim = self.dims.get(name)
        return RecipeError(f"--shape {name}={size}: {message}" + (f" (this build takes {_taken(name, dim)})" if dim else ""))


def _taken(name: str, dim: DimSpec) -> str:
    if not dim.dynamic:
        return f"{name} {dim.size} only"
    return f"{name} {dim.min or 1} to {dim.max}" if dim.max is not None else f"{name} from {dim.min or 1}"


def _text_config(plan: BuildPlan) -> tuple[dict[str, Any], str] | None:
    """The model's (text) config as a mapping, and its class's name; None for a factory model, known only once built."""
    from aot.model_blueprint import model_blueprint

    blueprint = model_blueprint(plan.model)
    if blueprint is None:
        return None
    config = blueprint.config.get_text_config()
    return config.to_dict(), type(config).__name__


def _check_sequence_positions(plan: BuildPlan, entries: list[dict[str, int]]) -> None:
    """No size of the grid feeds a token input a sequence longer than the model's position table."""
    config = _text_config(plan)
    if config is None:
        return
    demands = [dataclasses.replace(demand, what=str(demand.size)) if demand.location[:2] == ("validate", "shapes") else demand
               for demand in sequence_demands(plan.inputs.spec, entries)]
    check_position_limit(demands, config[0], config[1], _GridOption(entries))


def _check_generation_positions(plan: BuildPlan, shapes: list[dict[str, int]], prompt_given: bool, new_tokens: int) -> None:
    """Each prompt, and each new token but the last after it, within the model's position table (where it has one)."""
    config = _text_config(plan)
    table = position_table(config[0]) if config is not None else None
    if table is None:
        return
    key, limit = table
    longest = limit - generation_length(0, new_tokens)  # the longest prompt that fits, with these new tokens
    if longest < 1:
        raise RecipeError(f"--new-tokens {new_tokens}: even a 1-token prompt feeds {generation_length(1, new_tokens)} "
                          f"positions, above the model's {key} {limit} ({config[1]}): at most {limit} new tokens")
    for prompt in sorted({shape["prompt"] for shape in shapes}):
        fed = generation_length(prompt, new_tokens)
        if fed > limit:
            given = "" if prompt_given else " (the default)"
            raise RecipeError(f"--shape prompt={prompt}{given}: {prompt} tokens + --new-tokens {new_tokens} - 1 = {fed} "
                              f"positions, above the model's {key} {limit} ({config[1]}): with --new-tokens {new_tokens} "
                              f"this build takes prompt 1 to {longest}")


def _fitting_peers(plan: BuildPlan, items: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The peers ``items`` names that this build can have, in order, and the group members skipped, with why."""
    try:
        named = expand_peers(items)
    except ValueError as error:
        raise RecipeError(f"--peers: {error}") from None
    device, decoder = plan.model.spec.device, plan.model.decoder_step
    on_cuda = device.startswith("cuda")
    kept, skipped = [], {}
    for peer, group in named.items():
        asked = f"--peers {group or peer}"
        if (peer in DECODER_PEERS) != decoder:
            kind = "a decoder build takes only the decoder peers" if decoder else "the decoder peers are for a decoder build"
            raise RecipeError(f"{asked}: {kind} ({', '.join(DECODER_PEERS)})")
        if (peer in CUDA_PEERS) != on_cuda:
            where = f"a build on {device} takes only the CUDA peers" if on_cuda else "the CUDA peers are for a CUDA build"
            raise RecipeError(f"{asked}: {where} ({', '.join(CUDA_PEERS)})")
        missing = _missing_for(plan, peer)
        if missing is None:
            kept.append(peer)
        elif group is None:
            raise RecipeError(f"--peers {peer}: {missing}")
        else:
            skipped[peer] = f"{missing} (one of --peers {group})"
    return tuple(kept), skipped


def _missing_for(plan: BuildPlan, peer: str) -> str | None:
    """What ``peer`` needs that this build has not; None when it has all."""
    if peer in BUILD_PEERS and not plan.export.graph_module.cuda_graphs:
        return "this build's GraphModule has no CUDA graph buckets (export.graph_module.cuda_graphs)"
    if peer in CHECKPOINT_PEERS and plan.model.pretrained is None:
        return without_checkpoint(peer)
    return None
