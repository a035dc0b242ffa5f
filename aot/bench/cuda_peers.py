"""Peers for a CUDA build (``aot bench --peers cuda``): what torch itself makes of the eager model on the GPU.

- ``eager_float16``: the eager model cast to float16 (its floating inputs too), the usual way to use
  a GPU's tensor cores without any tool; for a float16 recipe it is the eager runner again;
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

CUDA_PEERS = ("eager_float16", "torch_compile", "torch_compile_cuda_graphs")

Runner = Callable[[dict[str, torch.Tensor]], Any]


def build_cuda_peer(peer: str, model: torch.nn.Module) -> Runner:
    """A runner for ``peer`` (one of :data:`CUDA_PEERS`) over the eager model, on the model's CUDA device."""
    if next(model.parameters()).device.type != "cuda":
        raise RuntimeError(f"{peer} is a CUDA peer, and this model is on {next(model.parameters()).device}")
    if peer == "eager_float16":
        model = model.to(torch.float16)
        return lambda inputs: model(**{name: _half(value) for name, value in inputs.items()})
    mode = "reduce-overhead" if peer == "torch_compile_cuda_graphs" else "default"
    compiled = torch.compile(model, mode=mode, dynamic=False)
    return lambda inputs: compiled(**inputs)


def _half(value: Any) -> Any:
    return value.to(torch.float16) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
