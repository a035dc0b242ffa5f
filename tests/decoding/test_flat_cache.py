"""FlatCacheDecoder in eager mode: greedy tokens equal eager generate's; sliding-window presents stay bounded."""

from __future__ import annotations

import pytest
import torch

from aot.decoding.greedy import first_divergence, greedy_generate
from aot.decoding.names import input_names, output_names
from tests.decoding.zoo import MODELS, NEW_TOKENS, WINDOW, decoder, eager_generate, mistral, prompts


def assert_same_tokens(runner: str, step, model, past_layout) -> None:
    """``step``'s greedy tokens equal ``model.generate``'s for every prompt, and they are not one token repeated."""
    for label, ids, mask in prompts():
        expected = eager_generate(model, ids, mask)
        new = expected[:, ids.shape[1]:]
        assert all(len(set(row.tolist())) >= 4 for row in new), f"eager tokens barely vary for '{label}': {new.tolist()}"
        actual = greedy_generate(step, ids, mask, NEW_TOKENS, past_layout=past_layout)
        divergence = first_divergence(expected, actual, ids.shape[1])
        assert divergence is None, divergence.describe(runner, label)


@pytest.mark.parametrize("name", list(MODELS))
def test_wrapper_generates_eager_tokens(name):
    flat = decoder(name)
    assert_same_tokens("FlatCacheDecoder", flat, flat.model, flat.past_layout)


def test_names_follow_the_convention():
    flat = decoder("llama")
    assert flat.input_names()[:5] == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key", "past_key_values.0.value"]
    assert flat.output_names() == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert input_names(1, with_position_ids=False) == ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"]
    assert output_names(0) == ["logits"]


def test_layer_kinds_come_from_the_config():
    assert decoder("llama").windows == (None, None)
    assert decoder("mistral_window_8").windows == (WINDOW, WINDOW)


def test_prefill_with_empty_past_matches_the_model():
    flat = decoder("llama")
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        logits, *present = flat(ids, mask, positions, *flat.past_layout.empty(2))
        expected = flat.model(input_ids=ids, attention_mask=mask).logits
    assert [tuple(t.shape) for t in present] == [(2, 2, 6, 16)] * 4
    torch.testing.assert_close(logits, expected)


def test_sliding_window_present_stays_bounded_and_tokens_match():
    flat = decoder("mistral_window_8")
    lengths = []

    def recording_step(*inputs):
        outputs = flat(*inputs)
        lengths.append(max(present.shape[2] for present in outputs[1:]))
        return outputs

    label, ids, mask = prompts()[-1]  # the longest prompt, batch 2
    expected = eager_generate(flat.model, ids, mask)
    assert ids.shape[1] + NEW_TOKENS > 4 * WINDOW, "the test must generate well past the window"
    assert not torch.equal(expected, eager_generate(mistral(window=None), ids, mask)), "the window must change the tokens"
    actual = greedy_generate(recording_step, ids, mask, NEW_TOKENS, past_layout=flat.past_layout)
    divergence = first_divergence(expected, actual, ids.shape[1])
    assert divergence is None, divergence.describe("FlatCacheDecoder", label)
    assert len(lengths) == NEW_TOKENS and max(lengths) == WINDOW - 1, lengths


def test_wrong_number_of_inputs_is_refused():
    flat = decoder("gpt2")
    ids = torch.ones((1, 2), dtype=torch.long)
    with pytest.raises(ValueError, match=r"takes \['position_ids', 'past_key_values.0.key'.*5 tensors, got 1"):
        flat(ids, ids, ids)


def test_past_shorter_than_the_mask_is_refused():
    flat = decoder("llama")
    ids = torch.ones((1, 2), dtype=torch.long)
    past = flat.past_layout.empty(1)
    with pytest.raises(RuntimeError, match="layer 0's past holds 0 tokens, the attention mask 3 before this step"):
        flat(ids, torch.ones((1, 5), dtype=torch.long), ids, *past)
