"""The export frontend traces decoders with use_cache=False, as the fx frontend does: a cache object is no graph output."""

from __future__ import annotations

import torch
import transformers

from aot.outputs import flatten_outputs
from aot.tracing import export_trace
from tests.tracing.tracing_zoo import EXPORT_DIMS, unpadded_token_inputs



def test_a_decoder_whose_config_asks_for_a_cache_exports_and_matches_eager():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaModel(config).eval()
    assert model.config.use_cache, "precondition: eager returns a DynamicCache, which torch.export cannot return"

    graph_module = export_trace(model, unpadded_token_inputs(2, 16), dynamic_dims=EXPORT_DIMS)

    assert graph_module.meta["trace_report"]["notes"] == ["traced with use_cache=False"]
    assert model.config.use_cache, "the model's config is as it was"
    for batch, sequence in ((1, 5), (2, 16), (3, 12)):
        inputs = unpadded_token_inputs(batch, sequence)
        with torch.no_grad():
            expected, got = flatten_outputs(model(**inputs, use_cache=False)), flatten_outputs(graph_module(**inputs))
        assert list(got) == ["last_hidden_state"]
        torch.testing.assert_close(got["last_hidden_state"], expected["last_hidden_state"])
