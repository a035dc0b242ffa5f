"""The recipe a build cell runs: the tiny model, its default inputs as dynamic dims, the table's shapes.

The inputs are what aot's dummy inputs hold for the model (names, ranks, dtypes), with
the axes that follow the batch or a sequence named as recipe dims, and every other
size fixed. A dim's sizes are those of the dummy inputs (raw audio: the samples that make
as many frames as tokens), its bounds those at 2 and 32 tokens. The recipe validates at the table's second and third shapes.
"""

from __future__ import annotations

import torch
import yaml

from aot.tracing.dummy_inputs import default_input_names, pools_at_eos

from .shapes import SHAPES, inputs_at, named_axes
from .tiny_config import model_config

_MAX = {"batch": 8, "sequence": 32}  # tokens; every other dim's bounds are its sizes in the dummy inputs at 2 and 32 tokens


def tiny_recipe(model_type: str, class_name: str, frontend: str, model: torch.nn.Module) -> dict:
    names = default_input_names(model)
    axes = named_axes(model, names)
    example = inputs_at(model, names, *SHAPES[0])
    used = sorted({dim for named in axes.values() for dim in named.values()})

    def sizes_at(batch: int, sequence: int) -> dict[str, int]:
        """Each dim's size in the dummy inputs at this batch and token count (raw audio: its samples)."""
        made = inputs_at(model, names, batch, sequence)
        return {dim: made[name].shape[axis] for name, named in axes.items() for axis, dim in named.items()}

    trace_sizes = sizes_at(*SHAPES[0])
    smallest, largest = sizes_at(2, 2), sizes_at(2, _MAX["sequence"])
    tensors = [
        {
            "name": name,
            "shape": [axes.get(name, {}).get(axis, size) for axis, size in enumerate(value.shape)],
            "dtype": str(value.dtype).removeprefix("torch."),
            **_eos_at_the_end(model, name),
        }
        for name, value in example.items()
    ]
    return {
        "name": f"coverage-{model_type}",
        "model": {"config": model_config(model_type, type(model)), "class": class_name, "seed": 0},
        "inputs": {
            "dims": {
                dim: {"size": trace_sizes[dim], "dynamic": True, "min": 1 if dim == "batch" else smallest[dim],
                      "max": _MAX["batch"] if dim == "batch" else largest[dim]}
                for dim in used
            },
            "tensors": tensors,
        },
        "trace": {"frontend": frontend},
        "validate": {"shapes": [{dim: sizes_at(*shape)[dim] for dim in used} for shape in SHAPES[1:]] if used else []},
    }


def _eos_at_the_end(model: torch.nn.Module, name: str) -> dict:
    """A head that pools at each row's EOS (BART's classifier) gets it once, at the end, as its dummy inputs do."""
    eos = getattr(model.config, "eos_token_id", None)
    if name != "input_ids" or not pools_at_eos(model) or not isinstance(eos, int):
        return {}
    return {"low": eos + 1, "last": eos}


def tiny_recipe_text(model_type: str, class_name: str, frontend: str, model: torch.nn.Module) -> str:
    return yaml.safe_dump(tiny_recipe(model_type, class_name, frontend, model), sort_keys=False)
