"""The shapes a cell is checked at, and which input axes follow them.

aot's dummy inputs (``aot.tracing.dummy_inputs.make_dummy_inputs``) take a batch and a
sequence length and work out each input's shape from the model: token inputs, decoder
inputs at half the length, a multiple-choice head's choices axis, an image of the
config's size. Which axis of which input is the batch, or a sequence, is found the
same way, by making inputs at a second batch and a second length and seeing which
sizes move: the export frontend's dynamic dims and a recipe's dims both come from it.
"""

from __future__ import annotations

import torch

from aot.tracing.dummy_inputs import make_dummy_inputs

# (batch, sequence); the first is the trace shape (make_dummy_inputs' own default), the
# second the one symbolic_trace checks itself at. Batches start at 2: aot pads the second row.
SHAPES = ((2, 16), (3, 11), (4, 23))


def inputs_at(model: torch.nn.Module, names: list[str], batch: int, sequence: int) -> dict[str, torch.Tensor]:
    return make_dummy_inputs(model, names, batch=batch, sequence=sequence)


def named_axes(model: torch.nn.Module, names: list[str]) -> dict[str, dict[int, str]]:
    """``{input: {axis: "batch" | "sequence" | "decoder_sequence"}}`` for the axes that follow the shape."""
    (batch, sequence), (other_batch, other_sequence) = SHAPES[:2]
    base = inputs_at(model, names, batch, sequence)
    batched = inputs_at(model, names, other_batch, sequence)
    lengthened = inputs_at(model, names, batch, other_sequence)
    axes: dict[str, dict[int, str]] = {}
    for name, value in base.items():
        for axis, size in enumerate(value.shape):
            if batched[name].shape[axis] != size:
                axes.setdefault(name, {})[axis] = "batch"
            elif lengthened[name].shape[axis] != size:
                axes.setdefault(name, {})[axis] = "decoder_sequence" if name.startswith("decoder_") else "sequence"
    return axes
