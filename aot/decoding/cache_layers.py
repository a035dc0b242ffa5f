"""transformers cache layers loaded from flat tensors, sized from the mask without branching on sizes.

Each layer is told how many tokens the sequence saw before this step (``seen``: the
attention mask's columns minus this step's tokens) and holds ``past`` of them (its loaded
keys' length). What the masks need, ``get_mask_sizes(query_length) -> (kv_length, kv_offset)``
(the keys attention sees this step, and the position of the first) and the query's offset
``get_seq_length()``, are then the same expressions for both kinds::

    kv_length = past + query_length
    kv_offset = seen - past
    offset    = seen

A full-attention layer holds every token (``past = seen``: offset 0, as ``DynamicLayer`` says).
A sliding-window layer holds the last ``min(seen, window - 1)`` (a query token sees itself and
the ``window - 1`` before it), which gives what ``DynamicSlidingWindowLayer`` computes with
branches (``is_full = cumulative_length >= window``...).

Why no branch and no ``past == seen``: under ``torch.export`` each size branch becomes a guard
of the exported program, and stating ``mask length == past + sequence`` makes the mask's
length derived from two sizes torch.export assumes to be at least 2, so the program would
refuse masks shorter than 4 (a prompt of 3 tokens). Sized this way, the mask's length
is a dimension of its own and the masks' padding checks (``kv_length + kv_offset > mask
length``) fold to false for every size.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class FlatFullAttentionLayer(DynamicLayer):
    """A ``DynamicLayer`` holding ``keys``/``values``, every one of the ``seen_tokens`` tokens; see the module docstring."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, seen_tokens: int | torch.SymInt):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.seen_tokens = seen_tokens

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen_tokens = self.seen_tokens + key_states.shape[-2]
        return super().update(key_states, value_states, *args, **kwargs)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of the keys attention sees this step; called before ``update``."""
        past = self.keys.shape[-2]
        return past + query_length, self.seen_tokens - past

    def get_seq_length(self) -> int:
        return self.seen_tokens


class FlatSlidingWindowLayer(DynamicSlidingWindowLayer):
    """A ``DynamicSlidingWindowLayer`` holding the last ``keys``/``values`` of ``seen_tokens`` tokens; see the module docstring."""

    def __init__(self, sliding_window: int, keys: torch.Tensor, values: torch.Tensor, seen_tokens: int | torch.SymInt):
        super().__init__(sliding_window=sliding_window)
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.cumulative_length = seen_tokens  # the stock layer's count of tokens seen: get_seq_length returns it

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values; keep the last ``window - 1``; return all of them for attention."""
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        self.cumulative_length = self.cumulative_length + key_states.shape[-2]
        total = full_keys.shape[-2]
        kept = torch.sym_min(total, self.sliding_window - 1)
        # Indices, not a slice: slicing [-(window - 1):] clamps its start with a size branch.
        last = torch.arange(kept, device=full_keys.device) + (total - kept)
        self.keys = full_keys.index_select(-2, last)
        self.values = full_values.index_select(-2, last)
        return full_keys, full_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of the keys attention sees this step; called before ``update``."""
        past = self.keys.shape[-2]
        return past + query_length, self.cumulative_length - past
