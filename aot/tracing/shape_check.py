"""What ``symbolic_trace`` checks of a graph traced at one shape: that it holds at another.

A graph is traced on example values of one shape. Model code that branches on a
size, or bakes one in (``x.view(2, 16, ...)``, ``if seq_len == 1``), yields a graph
that is right at that shape only, and nothing says so until it runs elsewhere:
wav2vec2 traced on one feature frame was off by 0.047 at two. So:

- with ``disable_check=False`` (the default), a graph traced on inputs that
  ``symbolic_trace`` made itself is run against the eager model at a second shape
  (batch 3, sequence 11, next to the tracing shape's 2 x 16), and a difference is a
  ``TraceError`` naming the output;
- example inputs with a dimension of size 0 or 1, which specialise the most code
  (broadcasting, ``squeeze``, ``== 1`` tests), are named in the trace report's notes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from aot.errors import TraceError
from aot.tracing.outputs import flatten_outputs

from .dummy_inputs import make_dummy_inputs

logger = logging.getLogger(__name__)

SECOND_BATCH = 3
SECOND_SEQUENCE = 11
_RTOL = 1e-4
_ATOL = 1e-5  # relative to the largest magnitude of the output


def specialising_sizes(inputs: Mapping[str, Any]) -> list[str]:
    """A note for each example dimension of size 0 or 1."""
    notes = []
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            continue
        for axis, size in enumerate(value.shape):
            if size in (0, 1):
                notes.append(
                    f"input '{name}' axis {axis} was traced at size {size}: code that tests or broadcasts a size of "
                    "0 or 1 is traced for it alone; trace at size >= 2 if that axis varies"
                )
    for note in notes:
        logger.warning("%s", note)
    return notes


@contextlib.contextmanager
def same_random_draws(seed: int = 0) -> Iterator[None]:
    """Run under a fixed seed, the caller's generator state put back after.

    A model that draws random numbers in forward (Hiera's pretraining head masks random units
    when given no ``noise``) then draws the same ones in eager and in its graph, which holds the
    same ``torch.rand`` call.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def check_at_second_shape(
    model: torch.nn.Module, graph_module: torch.fx.GraphModule, input_names: Sequence[str], static_kwargs: Mapping[str, Any]
) -> str:
    """Run eager and the graph at the second shape; raise TraceError where they differ; return what was checked."""
    name = type(model).__name__
    if model.training:
        return "not checked at a second shape: the model is in training mode (dropout draws differ)"
    try:
        inputs = make_dummy_inputs(model, input_names, batch=SECOND_BATCH, sequence=SECOND_SEQUENCE)
    except TraceError as error:
        return f"not checked at a second shape: {error}"
    shape = f"batch {SECOND_BATCH}, sequence {SECOND_SEQUENCE}"
    with torch.no_grad():
        try:
            with same_random_draws():
                expected = flatten_outputs(model(**inputs, **static_kwargs))
        except Exception as error:  # the model itself cannot take these inputs: nothing to compare with
            return f"not checked at a second shape ({shape}): the model fails on it: {type(error).__name__}"
        try:
            with same_random_draws():
                actual = flatten_outputs(graph_module(**inputs))
        except Exception as error:
            raise TraceError(f"the traced graph of {name} fails at a second shape ({shape}): {type(error).__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''}; {_WAY_OUT}") from None
    for output, want in expected.items():
        got = actual.get(output)
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
            continue
        if got.shape != want.shape:
            raise TraceError(f"the traced graph of {name} gives '{output}' the shape {list(got.shape)} at a second shape "
                             f"({shape}), eager {list(want.shape)}: it specialised on the tracing shape; {_WAY_OUT}")
        if want.is_floating_point():
            scale = float(want.abs().max()) if want.numel() else 0.0
            close = torch.allclose(got, want, rtol=_RTOL, atol=_ATOL * max(scale, 1.0), equal_nan=True)
        else:
            close = torch.equal(got, want)
        if not close:
            error = float((got.double() - want.double()).abs().max())
            raise TraceError(f"the traced graph of {name} differs from the model at a second shape ({shape}): '{output}' "
                             f"is off by up to {error:.3g}: it specialised on the tracing shape; {_WAY_OUT}")
    return f"checked against eager at a second shape ({shape})"


_WAY_OUT = ("make the code that reads the size a leaf module or an autowrap function, use the export frontend, "
            "or pass disable_check=True to skip this check")
