"""Trace-time stand-ins for the mask builders of ``transformers.masking_utils``.

``create_causal_mask`` and friends read the config, and for SDPA look at the
*values* of the padding mask to decide whether the mask can be skipped
(``None``) — data-dependent control flow. While tracing, each builder is
replaced by a function that takes the static decisions (attention
implementation, sliding window, whether a padding mask was given) in Python
and records the rest as a single call to a pure-torch leaf from
``torch_functions``::

    create_bidirectional_mask(config, inputs_embeds=e, attention_mask=m)
        -> bidirectional_attention_mask(m, e, e, additive)      # one call_function node

    create_causal_mask(config, inputs_embeds=e, attention_mask=None), sdpa
        -> None                                                  # SDPA's is_causal, as eager does

    create_causal_mask(config, inputs_embeds=e, attention_mask=m, cache=cache)   # past_key_values= before 5.24
        -> cached_causal_attention_mask(e, m, query_offset, key_offset, key_length, window, additive)
                                                                 # offsets and lengths from the cache layer

    create_bidirectional_sliding_window_mask(config, inputs_embeds=e, attention_mask=m)
        -> bidirectional_sliding_window_mask(e, m, config.sliding_window, additive)

The graph always materialises a mask where eager *might* have skipped it after
looking at the data (an all-ones padding mask): the numbers are the same.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch.fx

from aot.compat.transformers_cache import CACHE_ARGUMENT_NAMES
from aot.errors import TraceError

from .torch_functions import bidirectional_attention_mask, bidirectional_sliding_window_mask, cached_causal_attention_mask, causal_attention_mask

MASK_BUILDER_KINDS = {
    "create_causal_mask": "causal",
    "create_sliding_window_causal_mask": "sliding",
    "create_bidirectional_mask": "bidirectional",
    "create_bidirectional_sliding_window_mask": "bidirectional_sliding",
    "create_chunked_causal_mask": "chunked",
}


def traced_mask_builder(original: Callable, kind: str) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def builder(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.update(arguments.pop("kwargs", None) or {})
        proxies = [value for value in arguments.values() if isinstance(value, torch.fx.Proxy)]
        if not proxies:
            return original(*args, **kwargs)
        return build_traced_mask(proxies[0].tracer, original.__name__, kind, arguments)

    return builder


def build_traced_mask(tracer, builder_name: str, kind: str, arguments: dict[str, Any]) -> Any:
    config = arguments["config"]
    if kind in ("causal", "sliding") and not getattr(config, "is_causal", True):
        kind = "bidirectional" if kind == "causal" else "bidirectional_sliding"
    cache = next((arguments[name] for name in CACHE_ARGUMENT_NAMES if arguments.get(name) is not None), None)
    if cache is not None and kind not in ("causal", "sliding"):
        raise TraceError(f"{builder_name} with a KV cache is not supported by the fx tracer; use the export frontend (trace: export)")
    unsupported = [
        name
        for name in ("or_mask_function", "and_mask_function", "block_sequence_ids")
        if arguments.get(name) is not None
    ]
    if unsupported or kind == "chunked":
        what = ", ".join(unsupported) or f"{kind} attention"
        raise TraceError(
            f"{builder_name} with {what} is not supported by the fx tracer; use the export frontend (trace: export)"
        )
    mask = arguments.get("attention_mask")
    if mask is not None and mask.ndim == 4:
        return mask  # an already prepared 4D mask is used as is, as in transformers
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in ("sdpa", "eager"):
        raise TraceError(
            f"{builder_name}: attention implementation '{implementation}' cannot be traced; "
            f"load the model with attn_implementation='sdpa' or 'eager'"
        )
    additive = implementation == "eager"
    embeds = arguments["inputs_embeds"]
    window = None
    if kind in ("sliding", "bidirectional_sliding"):
        window = getattr(config, "sliding_window", None)
        if window is None:
            raise TraceError(f"{builder_name}: the config has no sliding_window")
    if kind == "bidirectional_sliding":  # never skipped: the window masks even without padding
        if arguments.get("encoder_hidden_states") is not None:
            raise TraceError(f"{builder_name} with encoder states is not supported by the fx tracer; use the export frontend (trace: export)")
        return tracer.create_proxy("call_function", bidirectional_sliding_window_mask, (embeds, mask, window, additive), {})
    if kind == "bidirectional":
        if mask is None:
            if arguments.get("allow_is_bidirectional_skip", True):
                return None
            raise TraceError(f"{builder_name} without a padding mask and without skipping is not supported by the fx tracer")
        keys = arguments.get("encoder_hidden_states")
        keys = embeds if keys is None else keys
        return tracer.create_proxy("call_function", bidirectional_attention_mask, (mask, embeds, keys, additive), {})
    if cache is not None:
        return _cached_mask(tracer, kind, arguments, embeds, mask, cache, window, additive)
    if mask is None and implementation == "sdpa" and window is None and arguments.get("allow_is_causal_skip", True):
        return None  # eager skips it too and SDPA runs with is_causal
    if mask is None and arguments.get("position_ids") is not None:
        tracer.note("position_ids are assumed to hold one sequence per row (packed sequences are not detected)")
    return tracer.create_proxy("call_function", causal_attention_mask, (embeds, mask, window, additive), {})


def _cached_mask(tracer, kind: str, arguments: dict[str, Any], embeds, mask, cache, window: int | None, additive: bool) -> Any:
    """A step on a KV cache: the cache layer says where its keys and the queries sit, as transformers asks it."""
    from transformers.masking_utils import find_first_full_attention_index

    layer_idx = arguments.get("layer_idx")
    if layer_idx is None and kind == "sliding":  # the first sliding layer, as create_sliding_window_causal_mask picks it
        sliding = list(getattr(cache, "is_sliding", ()))
        layer_idx = sliding.index(True) if True in sliding else 0
    elif layer_idx is None:
        layer_idx = find_first_full_attention_index(cache)
    query_offset = cache.get_query_offset(layer_idx)
    key_length, key_offset = cache.get_mask_sizes(embeds.shape[1], layer_idx)
    return tracer.create_proxy(
        "call_function", cached_causal_attention_mask, (embeds, mask, query_offset, key_offset, key_length, window, additive), {}
    )
