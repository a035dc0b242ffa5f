"""The KV cache as an fx input under either spelling: ``past_key_values`` (Optimum, transformers' fx tests) or ``cache``.

transformers 5.24's decoders spell the forward's cache ``cache``. transformers' own fx test
(``_create_and_check_torch_fx_tracing``, its KV-cache branch for Llama) traces with
``input_names=[..., "past_key_values"]`` on an empty cache and on one of 9 past tokens, then compares the
graph's outputs with the model's; ported here for Llama's five model classes, with both spellings.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers
from transformers import DynamicCache

from aot.errors import TraceError
from aot.tracing import symbolic_trace
from aot.tracing.dummy_inputs import forward_parameters
from aot.tracing.input_names import forward_keyword, forward_keywords
from aot.tracing.outputs import flatten_outputs

LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             vocab_size=99, max_position_embeddings=64, pad_token_id=0)
CLASSES = ["LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification", "LlamaForQuestionAnswering",
           "LlamaForTokenClassification"]
BATCH, SEQUENCE, PAST = 2, 7, 9  # the fx test's non-empty cache holds 9 tokens


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(transformers, name)(transformers.LlamaConfig(**LLAMA)).eval()


def _inputs(config, past: int) -> dict:
    """input_ids, a mask over the past and the new tokens, and a cache of ``past`` random tokens a layer."""
    generator = torch.Generator().manual_seed(past)
    heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers if past else 0):
        cache.update(*(torch.rand(BATCH, heads, past, head_dim, generator=generator) for _ in range(2)), layer)
    return {
        "input_ids": torch.randint(1, config.vocab_size, (BATCH, SEQUENCE), generator=generator),
        "attention_mask": torch.ones(BATCH, past + SEQUENCE, dtype=torch.long),
        "cache": cache,
    }


def test_either_spelling_binds_to_the_forwards_cache_parameter():
    parameters = forward_parameters(transformers.LlamaModel)
    assert "cache" in parameters and "past_key_values" not in parameters  # precondition: transformers 5.24's spelling
    assert forward_keyword("past_key_values", parameters) == "cache"
    assert forward_keyword("cache", parameters) == "cache"
    assert forward_keyword("input_ids", parameters) == "input_ids"
    assert forward_keyword("pixel_values", parameters) is None
    # a forward written before 5.24 (Optimum's code, remote code) takes `cache` under its old name too
    assert forward_keyword("cache", ["input_ids", "past_key_values"]) == "past_key_values"
    assert forward_keywords(["input_ids", "past_key_values", "extra"], parameters) == {
        "input_ids": "input_ids", "past_key_values": "cache", "extra": "extra"}


# The fx test's cases (every class, both caches) under its spelling; the current spelling on the base model.
CASES = [(name, past, "past_key_values") for name in CLASSES for past in (0, PAST)]
CASES += [("LlamaModel", past, "cache") for past in (0, PAST)]


@pytest.mark.parametrize(("name", "past", "spelling"), CASES)
def test_traced_with_a_cache_input_matches_eager(name, past, spelling):
    model = _model(name)
    inputs = _inputs(model.config, past)
    inputs[spelling] = inputs.pop("cache")
    assert inputs[spelling].get_seq_length() == past  # precondition: the cache holds what the case says
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the model is called with its own spelling: no deprecation
        gm = symbolic_trace(model, list(inputs), dummy_inputs=copy.deepcopy(inputs))
    assert [node.target for node in gm.graph.nodes if node.op == "placeholder"] == list(inputs)
    eager_inputs = {forward_keyword(key, forward_parameters(model)): value for key, value in copy.deepcopy(inputs).items()}
    with torch.no_grad():
        expected = _tensors(model(**eager_inputs, use_cache=False))
        actual = _tensors(gm(**copy.deepcopy(inputs)))
    assert expected, name  # precondition: something to compare
    assert list(actual) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, msg=f"{name} {key}")


def _tensors(output) -> dict[str, torch.Tensor]:
    """The output's tensors by name; the cache object the model hands back is left out, as the fx test leaves it."""
    named = {key: value for key, value in dict(output.items()).items() if not isinstance(value, DynamicCache)}
    return {key: value for key, value in flatten_outputs(named).items() if isinstance(value, torch.Tensor)}


def test_both_spellings_at_once_name_the_cache_twice():
    model = _model("LlamaModel")
    inputs = _inputs(model.config, PAST)
    inputs["past_key_values"] = inputs["cache"]
    with pytest.raises(TraceError, match="name an input twice"):
        symbolic_trace(model, list(inputs), dummy_inputs=inputs)


def test_an_input_the_forward_lacks_is_still_an_error():
    model = _model("LlamaModel")
    with pytest.raises(TraceError, match=r"has no input 'past_values'; its inputs are: .*cache"):
        symbolic_trace(model, ["input_ids", "past_values"])


@pytest.mark.parametrize("spelling", ["past_key_values", "cache"])
def test_no_dummy_cache_is_made_under_either_spelling(spelling):
    with pytest.raises(TraceError, match=f"input '{spelling}' of LlamaModel: a KV cache is an object"):
        symbolic_trace(_model("LlamaModel"), ["input_ids", "attention_mask", spelling])
