"""Decoders that generate: a causal LM as one flat KV-cache step, and a greedy loop over any such step.

The step follows Optimum's ONNX decoder-with-past convention (:mod:`aot.decoding.names`)::

    step(input_ids, attention_mask, [position_ids,] past_key_values.0.key, past_key_values.0.value, ...)
        -> (logits, present.0.key, present.0.value, ...)

- :mod:`aot.decoding.flat_cache`: ``FlatCacheDecoder``, a transformers causal LM behind that step;
- :mod:`aot.decoding.cache_layers`: the cache layers it loads the past into, sized without size branches;
- :mod:`aot.decoding.premade_masks`: the attention masks it makes ahead while torch.export traces;
- :mod:`aot.decoding.export_spec`: example inputs, dynamic axes, ``torch.export`` and ONNX exports of it;
- :mod:`aot.decoding.greedy`: ``greedy_generate`` (the tokens ``generate(do_sample=False)`` makes) and
  ``first_divergence``; torch and the standard library only, so that it can be pasted into an artifact;
- :mod:`aot.decoding.onnx_step`: ``OnnxStep``, an ONNX Runtime session called as a step;
- :mod:`aot.decoding.keyword_step` (``DecoderStep``, the step as the build traces it) and
  :mod:`aot.decoding.generation_check` (validation by generation): the build's use of the above.

Nothing is imported here: ``aot.decoding.greedy`` must stay importable without transformers
or ONNX Runtime.
"""
