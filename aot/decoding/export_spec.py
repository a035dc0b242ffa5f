"""Exporting a ``FlatCacheDecoder``: example inputs, named dynamic axes, ``torch.export`` and ONNX.

Every dimension but the heads and head size is dynamic: ``batch``, ``sequence``,
``total_sequence`` (the mask), ``past_sequence`` (full-attention layers),
``past_window_sequence`` (sliding-window layers); names in :mod:`aot.decoding.names`.
torch.export gets one ``Dim`` per name, bounded below by what generation feeds: batch,
sequence and mask from 1, the pasts from 0 (the prefill), a window's past up to ``window - 1``.

The example inputs are sized so that one trace serves prefill and decode alike:

- every dynamic size is at least 2 and differs from the others: torch.export specialises
  sizes 0 and 1, and may take two dimensions of equal size for one;
- the past has seen more tokens than the widest window, so sliding-window layers hold
  ``window - 1`` tokens while full-attention layers hold them all.

The exported program and the ONNX model still run a past of length 0 and a step of one
token, together too (a one-token prompt): the decoder has no branch on those sizes, and
its cache layers keep the mask's length free of the past's (:mod:`aot.decoding.cache_layers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .flat_cache import FlatCacheDecoder
from .names import BATCH, PAST_SEQUENCE, PAST_WINDOW_SEQUENCE, SEQUENCE, TOTAL_SEQUENCE

_SMALLEST_EXPORTABLE_WINDOW = 3  # a window of 2 or less keeps 0 or 1 past tokens, sizes torch.export specialises


def trace_sizes(decoder: FlatCacheDecoder) -> dict[str, int]:
    """``batch``, ``sequence`` and ``seen`` (past tokens) for the example inputs; see the module docstring."""
    windows = decoder.sliding_windows
    too_small = [window for window in windows if window < _SMALLEST_EXPORTABLE_WINDOW]
    if too_small:
        raise ValueError(f"sliding window {too_small[0]} is too small to export with a dynamic past (at least {_SMALLEST_EXPORTABLE_WINDOW})")
    window_pasts = {window - 1 for window in windows}
    seen = max(windows + [4]) + 2
    free = (size for size in range(2, seen) if size not in window_pasts)
    batch, sequence = next(free), next(free)
    return {"batch": batch, "sequence": sequence, "seen": seen}


def example_inputs(decoder: FlatCacheDecoder, batch: int, sequence: int, seen: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of one step: ``sequence`` new tokens after ``seen`` tokens, no padding, random past."""
    generator = torch.Generator().manual_seed(seed)
    vocab = decoder.text_config.vocab_size
    inputs = [
        torch.randint(0, vocab, (batch, sequence), generator=generator),
        torch.ones((batch, seen + sequence), dtype=torch.long),
    ]
    if decoder.takes_position_ids:
        inputs.append(torch.arange(seen, seen + sequence).expand(batch, sequence).clone())
    layout = decoder.past_layout
    for window, (heads, head_dim) in zip(decoder.windows, layout.heads_and_dims):
        length = seen if window is None else min(seen, window - 1)
        for _ in ("key", "value"):
            inputs.append(torch.randn((batch, heads, length, head_dim), generator=generator).to(layout.dtype))
    return tuple(inputs)


def dynamic_axes(decoder: FlatCacheDecoder) -> dict[str, dict[int, str]]:
    """``{input name: {axis: dimension name}}`` for every input, in input order."""
    axes = {"input_ids": {0: BATCH, 1: SEQUENCE}, "attention_mask": {0: BATCH, 1: TOTAL_SEQUENCE}}
    if decoder.takes_position_ids:
        axes["position_ids"] = {0: BATCH, 1: SEQUENCE}
    past = iter(decoder.input_names()[len(axes):])
    for window in decoder.windows:
        length = PAST_SEQUENCE if window is None else PAST_WINDOW_SEQUENCE
        for name in (next(past), next(past)):
            axes[name] = {0: BATCH, 2: length}
    return axes


def _export_dims(decoder: FlatCacheDecoder) -> dict[str, Any]:
    """One ``torch.export.Dim`` per dimension name, bounded to admit a prefill (past 0) and a decode step (sequence 1)."""
    windows = decoder.sliding_windows
    dims: dict[str, Any] = {
        BATCH: torch.export.Dim(BATCH, min=1),
        SEQUENCE: torch.export.Dim(SEQUENCE, min=1),
        TOTAL_SEQUENCE: torch.export.Dim(TOTAL_SEQUENCE, min=1),
        PAST_SEQUENCE: torch.export.Dim(PAST_SEQUENCE, min=0),
    }
    if windows:
        dims[PAST_WINDOW_SEQUENCE] = torch.export.Dim(PAST_WINDOW_SEQUENCE, min=0, max=max(windows) - 1)
    return dims


def _positional_shapes(decoder: FlatCacheDecoder, named: bool) -> tuple:
    """``dynamic_shapes`` for ``forward(input_ids, attention_mask, *rest)``: names (ONNX) or ``Dim`` objects (torch.export)."""
    dims = _export_dims(decoder)
    per_input = [{axis: (name if named else dims[name]) for axis, name in axes.items()} for axes in dynamic_axes(decoder).values()]
    return (per_input[0], per_input[1], tuple(per_input[2:]))


def export_program(decoder: FlatCacheDecoder) -> torch.export.ExportedProgram:
    """``torch.export.export(decoder, strict=False)`` with every dimension of :func:`dynamic_axes` dynamic."""
    inputs = example_inputs(decoder, **trace_sizes(decoder))
    with torch.no_grad():
        return torch.export.export(decoder, inputs, dynamic_shapes=_positional_shapes(decoder, named=False), strict=False)


def export_onnx(decoder: FlatCacheDecoder, path: Path, program: torch.export.ExportedProgram | None = None, opset: int = 18) -> Path:
    """``decoder`` as an ONNX model at ``path``: the convention's input and output names, named dynamic axes.

    ``program``, the decoder's :func:`export_program`, saves tracing it a second time.
    """
    inputs = example_inputs(decoder, **trace_sizes(decoder))
    with torch.no_grad():
        onnx_program = torch.onnx.export(
            decoder if program is None else program,
            inputs,
            input_names=decoder.input_names(),
            output_names=decoder.output_names(),
            dynamic_shapes=_positional_shapes(decoder, named=True),
            opset_version=opset,
            dynamo=True,
        )
    onnx_program.save(str(path))
    return Path(path)
