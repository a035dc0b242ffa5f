"""torch.export of FlatCacheDecoder, every dimension dynamic: its GraphModule generates eager's tokens."""

from __future__ import annotations

import pytest
import torch

from aot.decoding.export_spec import trace_sizes
from aot.decoding.greedy import first_divergence, greedy_generate
from tests.decoding.test_flat_cache import assert_same_tokens
from tests.decoding.zoo import MODELS, WINDOW, decoder, eager_generate, program


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(MODELS))
def test_exported_module_generates_eager_tokens(name):
    exported = program(name)
    user_inputs = [node for node in exported.graph.nodes if node.op == "placeholder" and node.name in exported.graph_signature.user_inputs]
    assert len(user_inputs) == len(decoder(name).input_names())
    for node in user_inputs:
        shape = node.meta["val"].shape
        dynamic = [shape[0]] + ([shape[2]] if len(shape) == 4 else [shape[1]])
        assert all(isinstance(size, torch.SymInt) for size in dynamic), f"{node.name} was specialised to {tuple(shape)}"
    assert_same_tokens("exported GraphModule", exported.module(), decoder(name).model, decoder(name).past_layout)


@pytest.mark.parametrize("name", list(MODELS))
def test_exported_module_runs_prompts_of_one_to_three_tokens(name):
    """Sizes the trace never saw: an empty past with one token, masks shorter than the traced sizes' sum (2 + 2)."""
    module = program(name).module()
    for length in (1, 2, 3):
        ids, mask = torch.arange(7, 7 + length)[None], torch.ones((1, length), dtype=torch.long)
        expected = eager_generate(decoder(name).model, ids, mask, new_tokens=4)
        actual = greedy_generate(module, ids, mask, 4, past_layout=decoder(name).past_layout)
        divergence = first_divergence(expected, actual, length)
        assert divergence is None, divergence.describe("exported GraphModule", f"len {length}, batch 1")


def test_trace_sizes_are_distinct_and_past_the_window():
    sizes = trace_sizes(decoder("mistral_window_8"))
    assert sizes["seen"] > WINDOW
    assert len({sizes["batch"], sizes["sequence"], sizes["seen"], WINDOW - 1}) == 4, sizes
