"""Attention masks made before the model runs, so that ``torch.export`` records no guard on the mask's length.

Why: with SDPA, transformers' ``sdpa_mask`` first asks ``_ignore_causal_mask_sdpa`` whether
it may skip the mask, and that function's first line compares sizes::

    if padding_mask is not None and padding_mask.shape[-1] > kv_length:   # masking_utils.py

before it returns "never skip while exporting". The mask holds every token seen
(``total_sequence``), ``kv_length`` the keys attention sees (``past + sequence``): for a
sliding-window layer the comparison is "has the sequence outgrown the window", and
torch.export keeps its traced answer as a guard of the exported program
(``attention_mask.size()[1] > input_ids.size()[1] + past_key_values.0.key.size()[2]``),
which then refuses the prefill and every step before the window fills; for a full-attention
layer it ties the mask's length to the past's.

The fix: while exporting, make the masks the model would make, with the same transformers
functions and ``allow_is_causal_skip=False`` (which is what exporting settles on anyway), and
hand them to the model, which uses masks given to it as they are. Keyed as
``generate`` keys the masks it makes ahead (``create_masks_for_generate``): one per layer type
where the config lists ``layer_types`` (those models take a dict), else one mask.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, create_causal_mask, create_sliding_window_causal_mask

from aot.compat.transformers_cache import cache_keyword


def premade_masks(config, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache, position_ids: torch.Tensor | None, dtype: torch.dtype):
    """The 4D mask (or ``{layer type: 4D mask}``) the model would make from ``attention_mask``, never skipped."""
    arguments = {
        "config": config,
        # The mask functions read only batch, query length, dtype and device from it.
        "inputs_embeds": torch.empty((*input_ids.shape, 0), dtype=dtype, device=input_ids.device),
        "attention_mask": attention_mask,
        **cache_keyword(create_causal_mask, cache),  # the mask builders renamed it with the models
        "position_ids": position_ids,
        "allow_is_causal_skip": False,
    }
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return {kind: LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[kind](**arguments) for kind in sorted(set(layer_types))}
    if getattr(config, "sliding_window", None) is not None:
        return create_sliding_window_causal_mask(**arguments)
    return create_causal_mask(**arguments)

