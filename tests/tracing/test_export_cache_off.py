"""The export frontend traces decoders with use_cache=False, as the fx frontend does: a cache object is no graph output."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.tracing import export_trace
from aot.tracing.outputs import flatten_outputs
from tests.tracing.tracing_zoo import EXPORT_DIMS, unpadded_token_inputs


@pytest.mark.artifact
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


@pytest.mark.artifact
def test_an_encoder_decoder_whose_decoder_stack_keeps_its_own_config_exports_and_matches_eager():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4)
    model = transformers.T5Model(config).eval()
    assert model.decoder.config is not model.config and model.decoder.config.use_cache, "precondition: the decoder's own config asks for a cache"

    def inputs(batch, sequence):
        return {**unpadded_token_inputs(batch, sequence), "decoder_input_ids": unpadded_token_inputs(batch, max(sequence - 3, 1))["input_ids"]}

    dims = {**EXPORT_DIMS, "decoder_input_ids": {0: "batch", 1: "decoder_seq"}}
    graph_module = export_trace(model, inputs(2, 16), dynamic_dims=dims)

    assert model.config.use_cache and model.decoder.config.use_cache, "every config is as it was"
    for batch, sequence in ((1, 5), (3, 12)):
        case = inputs(batch, sequence)
        with torch.no_grad():
            expected, got = flatten_outputs(model(**case, use_cache=False)), flatten_outputs(graph_module(**case))
        assert "last_hidden_state" in got and not any("past_key_values" in name for name in got), list(got)
        torch.testing.assert_close(got["last_hidden_state"], expected["last_hidden_state"])
