"""A transformers 5 causal LM as one flat KV-cache decoding step: tensors in, tensors out.

``FlatCacheDecoder(model)`` is called as (names and shapes: :mod:`aot.decoding.names`)::

    decoder(input_ids, attention_mask, [position_ids,] past.0.key, past.0.value, ...)
        -> (logits, present.0.key, present.0.value, ...)

Inside, it builds the cache transformers' ``generate`` would hold, ``DynamicCache(config=...)``,
whose layer types come from the config (``config.layer_types``, else ``sliding_window``
per layer: ``get_layer_types_and_kwargs``), and loads the past into it
(:mod:`aot.decoding.cache_layers`; each layer is told the tokens seen so far, the mask's
columns minus this step's):

- ``full_attention`` (``DynamicLayer``) -> ``FlatFullAttentionLayer``: the past as it is; its
  present is ``cat([past, new])``, ``past_sequence + sequence`` long;
- ``sliding_attention`` / ``chunked_attention`` (``DynamicSlidingWindowLayer``) ->
  ``FlatSlidingWindowLayer``: its present keeps the last ``window - 1`` tokens at most.

Both are sized without size branches, so that one export holds for a prefill (past 0), a
decode step (one token) and either side of a window. Any other layer type (linear
attention, shared KV) has no flat form here and is refused when the decoder is made.
While ``torch.export`` traces, the attention masks are made ahead (:mod:`aot.decoding.premade_masks`).
The model runs with ``use_cache=True``; the cache's tensors after the step are the present. The cache
goes in under the name the model's forward takes (``cache`` from transformers 5.24, ``past_key_values``
before: :mod:`aot.compat.transformers_cache`).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from aot.compat.torch_private import is_fx_symbolic_tracing
from aot.compat.transformers_cache import CACHE_ARGUMENT_NAMES, cache_argument, returned_cache
from aot.weights_dtype import compute_dtype

from .cache_layers import FlatFullAttentionLayer, FlatSlidingWindowLayer
from .greedy import PastLayout
from .names import input_names, output_names
from .premade_masks import premade_masks


class FlatCacheDecoder(torch.nn.Module):
    """``model`` (a transformers causal LM) behind the flat decoder-with-past step; see the module docstring."""

    def __init__(self, model: PreTrainedModel, last_logits_only: bool = False):
        """``last_logits_only``: ``logits`` of the last position only, (batch, 1, vocab), as ``generate`` computes
        them (``logits_to_keep=1``): a prefill then skips the vocabulary projection of every other token."""
        super().__init__()
        self.model = model
        self.cache_argument = cache_argument(model.forward)
        if self.cache_argument is None:
            raise ValueError(f"{type(model).__name__}.forward takes no KV cache (no {' or '.join(CACHE_ARGUMENT_NAMES)} argument)")
        self.last_logits_only = last_logits_only
        if last_logits_only and "logits_to_keep" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"{type(model).__name__}.forward takes no logits_to_keep: it cannot keep the last logits only")
        self.text_config = model.config.get_text_config(decoder=True)
        self.windows = _layer_windows(DynamicCache(config=self.text_config), type(model).__name__)
        self.takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
        self.past_layout = PastLayout(
            heads_and_dims=tuple(_heads_and_dim(self.text_config) for _ in self.windows),
            dtype=compute_dtype(model),
            takes_position_ids=self.takes_position_ids,
        )

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @property
    def sliding_windows(self) -> list[int]:
        """The windows of the sliding-window layers, in layer order (empty for a model with none)."""
        return [window for window in self.windows if window is not None]

    def input_names(self) -> list[str]:
        """Names of ``forward``'s positional inputs, in order."""
        return input_names(self.num_layers, self.takes_position_ids)

    def output_names(self) -> list[str]:
        """Names of ``forward``'s outputs, in order."""
        return output_names(self.num_layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *position_ids_and_past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        expected = len(self.input_names()) - 2
        if len(position_ids_and_past) != expected:
            raise ValueError(f"{type(self).__name__} takes {self.input_names()[2:]} after attention_mask: {expected} tensors, got {len(position_ids_and_past)}")
        position_ids = position_ids_and_past[0] if self.takes_position_ids else None
        past = position_ids_and_past[1:] if self.takes_position_ids else position_ids_and_past
        seen_tokens = attention_mask.shape[-1] - input_ids.shape[-1]
        cache = self._loaded_cache(past, seen_tokens)
        mask = attention_mask
        if torch.compiler.is_exporting():
            mask = premade_masks(self.text_config, input_ids, attention_mask, cache, position_ids, self.past_layout.dtype)
        inputs = {"input_ids": input_ids, "attention_mask": mask, self.cache_argument: cache, "use_cache": True}
        if self.last_logits_only:
            inputs["logits_to_keep"] = 1
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        output = self.model(**inputs)
        present = [tensor for layer in returned_cache(output).layers for tensor in (layer.keys, layer.values)]
        return (output["logits"], *present)

    def _loaded_cache(self, past: tuple[torch.Tensor, ...], seen_tokens: int) -> DynamicCache:
        cache = DynamicCache(config=self.text_config)
        for index, window in enumerate(self.windows):
            keys, values = past[2 * index], past[2 * index + 1]
            if window is not None:
                cache.layers[index] = FlatSlidingWindowLayer(window, keys, values, seen_tokens)
                continue
            if not torch.compiler.is_exporting() and not is_fx_symbolic_tracing():
                # Not a hint to torch.export: see aot.decoding.cache_layers for why the mask's length stays free there.
                # Nor under torch.fx, where the sizes are traced values the graph computes at run time.
                torch._check(
                    keys.shape[-2] == seen_tokens,
                    lambda: f"layer {index}'s past holds {keys.shape[-2]} tokens, the attention mask {seen_tokens} before this step",
                )
            cache.layers[index] = FlatFullAttentionLayer(keys, values, seen_tokens)
        return cache


def _layer_windows(template: DynamicCache, model_name: str) -> tuple[int | None, ...]:
    """Per layer: ``None`` for full attention, the window for sliding attention; other layer types are refused."""
    if not template.layers:
        raise ValueError(f"{model_name}: DynamicCache(config=...) made no cache layers; the config names no layers")
    windows: list[int | None] = []
    for index, layer in enumerate(template.layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            windows.append(int(layer.sliding_window))
        elif type(layer) is DynamicLayer:
            windows.append(None)
        else:
            raise ValueError(f"{model_name}: cache layer {index} is {type(layer).__name__}, which has no flat key/value form")
    return tuple(windows)


def _heads_and_dim(config) -> tuple[int, int]:
    """``(kv_heads, head_dim)`` of a layer's cached keys, read from the config as the attention modules read it."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(kv_heads), int(head_dim)
