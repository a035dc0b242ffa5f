"""greedy_generate stops at EOS as generate does; first_divergence names the first differing token."""

from __future__ import annotations

import pytest
import torch

from aot.decoding.greedy import Divergence, PastLayout, first_divergence, greedy_generate, prompt_position_ids
from tests.decoding.zoo import NEW_TOKENS, PAD, decoder, eager_generate, prompts


def test_eos_ends_a_row_with_padding_and_stops_when_all_rows_ended():
    flat = decoder("llama")
    label, ids, mask = prompts()[1]
    free_run = eager_generate(flat.model, ids, mask)[:, ids.shape[1]:].tolist()
    # An EOS that row 0 makes first at new token `end` and row 1 not before: row 0 ends alone.
    end = next(k for k in range(2, 16) if free_run[0][k] not in free_run[0][:k] and free_run[0][k] not in free_run[1][: k + 1])
    eos = free_run[0][end]
    expected = eager_generate(flat.model, ids, mask, eos_token_id=eos)
    assert (expected[0, ids.shape[1] + end + 1:] == PAD).all() and expected.shape[1] > ids.shape[1] + end + 1, "generate pads an ended row"
    actual = greedy_generate(flat, ids, mask, NEW_TOKENS, past_layout=flat.past_layout, eos_token_id=eos, pad_token_id=PAD)
    divergence = first_divergence(expected, actual, ids.shape[1])
    assert divergence is None, divergence.describe("FlatCacheDecoder", label)
    assert actual.shape == expected.shape
    ended_together = free_run[1].index(eos) + 1 if eos in free_run[1] else NEW_TOKENS
    assert actual.shape[1] == ids.shape[1] + ended_together, "the loop stops once every row has ended"


def test_positions_of_a_left_padded_prompt():
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert prompt_position_ids(mask).tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]


def test_empty_past_has_the_layout_shapes():
    layout = PastLayout(heads_and_dims=((2, 8), (3, 4)), dtype=torch.float16)
    past = layout.empty(batch=5)
    assert [(tuple(t.shape), t.dtype) for t in past] == [((5, 2, 0, 8), torch.float16)] * 2 + [((5, 3, 0, 4), torch.float16)] * 2


def test_first_divergence_finds_the_earliest_step_then_the_lowest_row():
    prompt = torch.tensor([[1, 2], [3, 4]])
    expected = torch.cat([prompt, torch.tensor([[5, 6, 7], [8, 9, 10]])], dim=1)
    assert first_divergence(expected, expected.clone(), 2) is None
    actual = expected.clone()
    actual[0, 4], actual[1, 3] = 0, 0
    assert first_divergence(expected, actual, 2) == Divergence(row=1, new_token_index=1, expected=9, actual=0)


def test_first_divergence_where_one_generation_ended_earlier():
    expected = torch.tensor([[1, 5, 6, 7]])
    divergence = first_divergence(expected, expected[:, :3], 1)
    assert divergence == Divergence(row=0, new_token_index=2, expected=7, actual=None)
    message = divergence.describe("graph_module", "len 1, batch 1")
    assert message == "graph_module: tokens differ from eager generate at new token 3 of prompt 'len 1, batch 1', row 0 (eager generate 7, graph_module end)"


def test_first_divergence_refuses_different_prompts():
    with pytest.raises(ValueError, match="same prompt"):
        first_divergence(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 9, 3]]), 2)


def test_greedy_generate_refuses_mismatched_mask():
    flat = decoder("gpt2")
    with pytest.raises(ValueError, match=r"must both be \(batch, sequence\)"):
        greedy_generate(flat, torch.ones((1, 3), dtype=torch.long), torch.ones((1, 4), dtype=torch.long), 2, past_layout=flat.past_layout)
