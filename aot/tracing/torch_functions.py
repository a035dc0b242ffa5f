"""Pure-torch functions that traced graphs call as leaves (``call_function`` nodes).

The tracer replaces the attention-mask builders of ``transformers.masking_utils``
(which read the config, inspect mask *values* to decide whether a mask can be
skipped, and return ``None`` or a tensor depending on them) by one call to a
function from this file. Each function here:

- refers only to ``torch``, ``math`` and ``operator`` (no transformers import),
- is self-contained (calls no other function of this file),
- derives batch size, lengths, dtype and device from its tensor arguments at
  run time, so the graph follows new shapes, ``gm.to(torch.bfloat16)`` and
  ``gm.to(device)``.

That lets the artifact writer copy their source into a torch-only saved module.

``check_condition`` stands in the same way for transformers' ``torch_compilable_check``,
whose condition is a traced value.

Mask conventions (those of transformers' ``sdpa_mask`` / ``eager_mask``), shape
``(batch, 1, q_len, kv_len)``:

- boolean (``additive=False``, for SDPA): ``True`` where a query may attend a key;
- additive (``additive=True``, for eager attention): ``0`` where it may,
  ``finfo(dtype).min`` where it may not, in the dtype of the hidden states.
"""

from __future__ import annotations

import torch


def bidirectional_attention_mask(
    attention_mask: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, additive: bool
) -> torch.Tensor:
    """Padding-only mask: query ``q`` of row ``b`` may attend key ``k`` iff ``attention_mask[b, k] != 0``.

    ``queries`` is ``(batch, q_len, hidden)`` (gives ``q_len`` and the device),
    ``keys`` is ``(batch, kv_len, hidden)`` (gives the batch and the dtype: the
    encoder states for cross-attention, else the same tensor as ``queries``).
    """
    batch = keys.shape[0]
    q_len = queries.shape[1]
    kv_len = attention_mask.shape[-1]
    allowed = attention_mask.to(device=queries.device, dtype=torch.bool)[:, None, None, :]
    allowed = allowed.expand(batch, 1, q_len, kv_len)
    if not additive:
        return allowed
    zero = torch.zeros((), device=allowed.device, dtype=keys.dtype)
    return torch.where(allowed, zero, torch.finfo(keys.dtype).min)


def causal_attention_mask(
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int | None,
    additive: bool,
) -> torch.Tensor:
    """Causal mask, optionally banded and padded.

    ``allowed[b, 0, q, k] = (k <= q) and (k > q - sliding_window if sliding_window) and attention_mask[b, k]``

    ``inputs_embeds`` is ``(batch, q_len, hidden)``; without a cache ``kv_len`` is
    the padding mask's length, or ``q_len`` when there is no padding mask.
    """
    batch = inputs_embeds.shape[0]
    q_len = inputs_embeds.shape[1]
    kv_len = attention_mask.shape[-1] if attention_mask is not None else q_len
    device = inputs_embeds.device
    q_idx = torch.arange(q_len, device=device)[:, None]
    kv_idx = torch.arange(kv_len, device=device)[None, :]
    allowed = kv_idx <= q_idx
    if sliding_window is not None:
        allowed = allowed & (kv_idx > q_idx - sliding_window)
    allowed = allowed[None, None, :, :]
    if attention_mask is not None:
        allowed = allowed & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    allowed = allowed.expand(batch, 1, q_len, kv_len)
    if not additive:
        return allowed
    zero = torch.zeros((), device=device, dtype=inputs_embeds.dtype)
    return torch.where(allowed, zero, torch.finfo(inputs_embeds.dtype).min)


def bidirectional_sliding_window_mask(
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int,
    additive: bool,
) -> torch.Tensor:
    """Bidirectional mask banded to a window, optionally padded (ModernBERT's local attention layers).

    ``allowed[b, 0, q, k] = (|q - k| <= sliding_window) and attention_mask[b, k]``, as transformers'
    ``sliding_window_bidirectional_overlay`` and the padding mask give it; ``kv_len`` is the padding
    mask's length, or ``q_len`` when there is none.
    """
    batch = inputs_embeds.shape[0]
    q_len = inputs_embeds.shape[1]
    kv_len = attention_mask.shape[-1] if attention_mask is not None else q_len
    device = inputs_embeds.device
    q_idx = torch.arange(q_len, device=device)[:, None]
    kv_idx = torch.arange(kv_len, device=device)[None, :]
    allowed = ((q_idx - kv_idx).abs() <= sliding_window)[None, None, :, :]
    if attention_mask is not None:
        allowed = allowed & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    allowed = allowed.expand(batch, 1, q_len, kv_len)
    if not additive:
        return allowed
    zero = torch.zeros((), device=device, dtype=inputs_embeds.dtype)
    return torch.where(allowed, zero, torch.finfo(inputs_embeds.dtype).min)


def cached_causal_attention_mask(
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_offset: int,
    key_offset: int,
    key_length: int,
    sliding_window: int | None,
    additive: bool,
) -> torch.Tensor:
    """Causal mask of a step that attends a KV cache: queries and keys at their positions in the sequence.

    Query ``i`` is token ``query_offset + i``, key ``j`` token ``key_offset + j`` (a sliding-window
    cache holds only the last tokens, so its first key is not token 0)::

        allowed[b, 0, i, j] = (key <= query) and (key > query - sliding_window if sliding_window)
                              and attention_mask[b, key]

    ``attention_mask`` is ``(batch, tokens seen + this step's)``, 0 on padding, as transformers'
    mask functions read it (``padding_mask[batch, kv_idx]``).
    """
    batch = inputs_embeds.shape[0]
    q_len = inputs_embeds.shape[1]
    device = inputs_embeds.device
    query = torch.arange(q_len, device=device)[:, None] + query_offset
    key = torch.arange(key_length, device=device)[None, :] + key_offset
    allowed = key <= query
    if sliding_window is not None:
        allowed = allowed & (key > query - sliding_window)
    allowed = allowed[None, None, :, :]
    if attention_mask is not None:
        padding = attention_mask.to(device=device, dtype=torch.bool).index_select(1, key[0])
        allowed = allowed & padding[:, None, None, :]
    allowed = allowed.expand(batch, 1, q_len, key_length)
    if not additive:
        return allowed
    zero = torch.zeros((), device=device, dtype=inputs_embeds.dtype)
    return torch.where(allowed, zero, torch.finfo(inputs_embeds.dtype).min)


def check_condition(condition: bool | torch.Tensor, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition`` holds: transformers' ``torch_compilable_check``, traced.

    A model checks its inputs this way (BART's classifier: every row holds the same number
    of EOS tokens). The condition is computed by graph nodes; this call keeps the check in the
    graph, and under torch.export it becomes a runtime assertion, as ``torch._check`` is there.
    """
    if isinstance(condition, torch.Tensor):
        torch._check_tensor_all_with(ValueError, condition, lambda: message)
    else:
        torch._check_with(ValueError, condition, lambda: message)


LEAF_FUNCTIONS = (
    bidirectional_attention_mask,
    causal_attention_mask,
    bidirectional_sliding_window_mask,
    cached_causal_attention_mask,
    check_condition,
)
