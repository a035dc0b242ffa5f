"""Peers for a CUDA build (``aot bench --peers cuda``): what torch itself makes of the eager model on the GPU.

- ``eager_float16``: the eager model cast to float16 (its floating inputs too), the usual way to use
  a GPU's tensor cores without any tool; for a float16 recipe it is the eager runner again;
- ``eager_float32``: the eager model in float32, what a model runs at when nobody picks a precision
  (for a float32 recipe, the eager runner again);
- ``graph_module_uncaptured``: the build's own saved GraphModule without its CUDA graph buckets
  (``load(...).model``), so the bench shows what the buckets buy; for a build with buckets only;
- ``torch_compile``: ``torch.compile`` in its default mode (Inductor's fused Triton kernels), compiled
  for each shape at its first call: the bench reports that call's time, compile included;
- ``torch_compile_cuda_graphs``: ``torch.compile(mode="reduce-overhead")``, those kernels replayed
  from CUDA graphs, the peer the saved GraphModule's buckets (``export.graph_module.cuda_graphs``) are
  measured against.

Both compiled peers are ``dynamic=False``: one specialised program per shape, as the bench's fixed
grid allows, which is torch.compile at its fastest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Runner = Callable[[dict[str, torch.Tensor]], Any]


def build_cuda_peer(peer: str, model: torch.nn.Module) -> Runner:
    """A runner for ``peer`` (a CUDA peer of :mod:`aot.bench.peer_groups`, not one loaded from the build) over the eager
    model, on its CUDA device."""
    if next(model.parameters()).device.type != "cuda":
        raise RuntimeError(f"{peer} is a CUDA peer, and this model is on {next(model.parameters()).device}")
    if peer in ("eager_float16", "eager_float32"):
        dtype = torch.float16 if peer == "eager_float16" else torch.float32
        model = model.to(dtype)
        return lambda inputs: model(**{name: _cast(value, dtype) for name, value in inputs.items()})
    mode = "reduce-overhead" if peer == "torch_compile_cuda_graphs" else "default"
    compiled = torch.compile(model, mode=mode, dynamic=False)
    return lambda inputs: compiled(**inputs)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
