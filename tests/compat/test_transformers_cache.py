"""Both spellings of the KV-cache argument: ``cache`` (transformers >= 5.24) and ``past_key_values`` (before).

Whichever transformers is installed, a causal LM whose forward is written against the *other*
spelling is made here by wrapping the installed one, so each test covers both spellings on any
release in the window.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner

from aot.cli import main
from aot.compat.transformers_cache import CACHE_ARGUMENT_NAMES, cache_argument, cache_keyword, is_cache_argument, returned_cache
from aot.decoding.flat_cache import FlatCacheDecoder
from aot.decoding.greedy import greedy_generate
from tests.decoding.zoo import MODELS, NEW_TOKENS, prompts

INSTALLED = cache_argument(transformers.LlamaForCausalLM.forward)
OTHER = next(name for name in CACHE_ARGUMENT_NAMES if name != INSTALLED)


class OtherSpellingLlama(transformers.LlamaForCausalLM):
    """A Llama whose forward takes (and returns) its cache under the spelling the installed release does not use."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0, **kwargs):
        if OTHER in kwargs:
            kwargs[INSTALLED] = kwargs.pop(OTHER)
        output = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
        return {"logits": output.logits, OTHER: returned_cache(output)}


def _with_parameter(function, name):
    """``function``'s signature with the cache keyword ``name`` added, as a model file written for that release has it."""
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    parameters.extend(p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD)
    return signature.replace(parameters=parameters)


OtherSpellingLlama.forward.__signature__ = _with_parameter(OtherSpellingLlama.forward, OTHER)


def _models():
    native = MODELS["llama"]()
    other = OtherSpellingLlama(native.config).eval()
    other.load_state_dict(native.state_dict())
    return native, other


def test_the_installed_release_uses_one_spelling_and_the_wrapper_the_other():
    assert INSTALLED in CACHE_ARGUMENT_NAMES and OTHER in CACHE_ARGUMENT_NAMES and INSTALLED != OTHER
    native, other = _models()
    assert cache_argument(native.forward) == INSTALLED
    assert cache_argument(other.forward) == OTHER
    assert cache_argument(transformers.BertForMaskedLM.forward) is None
    assert all(is_cache_argument(name) for name in CACHE_ARGUMENT_NAMES) and not is_cache_argument("input_ids")


def test_cache_keyword_and_returned_cache_read_each_spelling():
    def old(input_ids, past_key_values=None): ...
    def new(input_ids, cache=None): ...
    def neither(input_ids): ...
    assert cache_keyword(old, 1) == {"past_key_values": 1}
    assert cache_keyword(new, 1) == {"cache": 1}
    assert cache_keyword(neither, 1) == {"cache": 1}
    for name in CACHE_ARGUMENT_NAMES:
        assert returned_cache({"logits": 0, name: "the cache"}) == "the cache"
    assert returned_cache({"logits": 0}) is None


@pytest.mark.artifact
def test_a_flat_step_generates_the_same_tokens_on_either_spelling():
    native, other = _models()
    steps = {name: FlatCacheDecoder(model) for name, model in ((INSTALLED, native), (OTHER, other))}
    assert {step.cache_argument for step in steps.values()} == set(CACHE_ARGUMENT_NAMES)
    for label, ids, mask in prompts():
        with torch.no_grad():
            tokens = {name: greedy_generate(step, ids, mask, NEW_TOKENS, past_layout=step.past_layout) for name, step in steps.items()}
        assert len(set(tokens[INSTALLED][0, ids.shape[1]:].tolist())) >= 4, f"barely varying tokens for '{label}'"
        assert torch.equal(tokens[INSTALLED], tokens[OTHER]), label


def test_a_model_without_a_cache_is_refused_naming_both_spellings(tmp_path: Path):
    recipe = tmp_path / "no_cache.yaml"
    recipe.write_text(
        "model:\n"
        "  config: {model_type: bert, num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 37}\n"
        "  class: BertForMaskedLM\n"
        "generation: {cache: true}\n"
    )
    result = CliRunner().invoke(main, ["check", str(recipe)])
    assert result.exit_code == 2, result.output
    message = result.output.strip().splitlines()[-1]
    assert "no_cache.yaml" in message and "BertForMaskedLM.forward takes neither cache nor past_key_values" in message, message


def test_a_flat_step_refuses_a_model_with_no_cache_argument():
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, vocab_size=64)
    model = transformers.BertForMaskedLM(config).eval()
    assert cache_argument(model.forward) is None
    with pytest.raises(ValueError, match=r"BertForMaskedLM.forward takes no KV cache \(no cache or past_key_values argument\)"):
        FlatCacheDecoder(model)
