"""UpcastLinear and UpcastEmbedding: weights stored in a narrow float dtype, computed in a wider one.

A bfloat16 checkpoint built into float32 artifacts (``model.weights_dtype`` in a recipe) keeps
its linear and embedding weights as the checkpoint stores them, and these modules widen
them where they are used: the float32 model's exact computation (widening bfloat16 or
float16 to float32 is exact) at half its weights' memory. A 1B-parameter Llama holds 2.5 GB
instead of 4.9 GB while it is traced, validated and quantised.

Self-contained on purpose: torch and the standard library only, private names start with
``_up``/``_UP``, so an artifact writer can paste this file into a torch-only ``module.py``.

- ``UpcastLinear``: ``y = x W'^T + b`` with ``W' = W.to(x.dtype)``, widened into one reused
  scratch tensor of ``_UP_ROWS_ELEMENTS`` elements, output rows at a time, so a 128,256 x 2,048
  output projection never exists in float32 whole (1 GB); each output column is the same
  dot product either way.
- ``UpcastEmbedding``: ``E[ids].to(compute_dtype)``: only the rows looked up are widened.
  An artifact keeps it, and stores the table at half the bytes.
"""

import threading

import torch
import torch.nn.functional as F

_UP_ROWS_ELEMENTS = 1 << 24  # 64 MiB of float32 weight widened at once
_up_scratch = threading.local()


def _up_widened(weight: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """``weight`` in ``input``'s dtype, written into this thread's reused scratch tensor.

    A fresh 64 MiB tensor per call would be mapped anew and fault on every page: measured
    one token through a 8192 x 2048 bfloat16 layer (AMD EPYC, 2 threads), ``weight.to`` then
    ``F.linear`` took 22.7 ms, copying into a kept tensor 5.3 ms (float32 weights: 3.3 ms).
    Fake tensors (a tracer's) and other subclasses get a plain copy: they must not be kept;
    so does a weight autograd tracks (the next call would overwrite what backward reads).
    """
    tracked = torch.is_grad_enabled() and weight.requires_grad
    if tracked or type(input) is not torch.Tensor or type(weight.data) is not torch.Tensor:
        return weight.to(input.dtype)
    scratch = getattr(_up_scratch, "tensor", None)
    if scratch is None or scratch.numel() < weight.numel() or scratch.dtype != input.dtype or scratch.device != weight.device:
        scratch = torch.empty(max(weight.numel(), _UP_ROWS_ELEMENTS), dtype=input.dtype, device=weight.device)
        _up_scratch.tensor = scratch
    return scratch[:weight.numel()].view(weight.shape).copy_(weight)


class UpcastLinear(torch.nn.Linear):
    """``nn.Linear`` whose weight is kept in a narrower float dtype than the input it multiplies."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, compute_dtype=torch.float32):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.compute_dtype = compute_dtype

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if weight.dtype == input.dtype:
            return F.linear(input, weight, bias)
        rows = max(1, _UP_ROWS_ELEMENTS // max(1, self.in_features))
        parts = []
        for start in range(0, weight.shape[0], rows):
            part_bias = None if bias is None else bias[start:start + rows].to(input.dtype)
            parts.append(F.linear(input, _up_widened(weight[start:start + rows], input), part_bias))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, compute_dtype={self.compute_dtype}"


class UpcastEmbedding(torch.nn.Embedding):
    """``nn.Embedding`` whose table is kept in a narrower float dtype than the vectors it returns."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None,
                 compute_dtype=torch.float32):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                         scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=_weight, _freeze=_freeze,
                         device=device, dtype=dtype)
        self.compute_dtype = compute_dtype

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input).to(self.compute_dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, compute_dtype={self.compute_dtype}"
