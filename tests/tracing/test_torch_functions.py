"""The pure-torch leaf functions equal transformers' masks, and are torch-only self-contained code."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from transformers import masking_utils

from aot.tracing import torch_functions
from aot.tracing.torch_functions import (
    LEAF_FUNCTIONS,
    bidirectional_attention_mask,
    bidirectional_sliding_window_mask,
    cached_causal_attention_mask,
    causal_attention_mask,
    check_condition,
)


def _padding(batch, length):
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length // 2:] = 0
    return mask


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("batch,q_len,kv_len", [(2, 7, 7), (1, 1, 1), (3, 4, 9)])
def test_bidirectional_mask_equals_transformers(batch, q_len, kv_len, additive):
    padding = _padding(batch, kv_len)
    queries, keys = torch.randn(batch, q_len, 8), torch.randn(batch, kv_len, 8)
    reference = (masking_utils.eager_mask if additive else masking_utils.sdpa_mask)(
        batch_size=batch, q_length=q_len, kv_length=kv_len, mask_function=masking_utils.bidirectional_mask_function,
        attention_mask=padding.bool(), allow_is_causal_skip=False, dtype=keys.dtype,
    )
    assert torch.equal(bidirectional_attention_mask(padding, queries, keys, additive), reference)


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("batch,length", [(2, 7), (1, 1), (3, 12)])
def test_causal_mask_equals_transformers(batch, length, padded, window, additive):
    padding = _padding(batch, length) if padded else None
    embeds = torch.randn(batch, length, 8, dtype=torch.bfloat16)
    function = masking_utils.causal_mask_function
    if window is not None:
        function = masking_utils.sliding_window_causal_mask_function(window)
    reference = (masking_utils.eager_mask if additive else masking_utils.sdpa_mask)(
        batch_size=batch, q_length=length, kv_length=length, mask_function=function,
        attention_mask=None if padding is None else padding.bool(), allow_is_causal_skip=False, dtype=embeds.dtype,
    )
    assert torch.equal(causal_attention_mask(embeds, padding, window, additive), reference)


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("window", [1, 3, 20])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("batch,length", [(2, 7), (1, 1), (3, 12)])
def test_bidirectional_sliding_window_mask_equals_transformers(batch, length, padded, window, additive):
    padding = _padding(batch, length) if padded else None
    embeds = torch.randn(batch, length, 8)
    reference = (masking_utils.eager_mask if additive else masking_utils.sdpa_mask)(
        batch_size=batch, q_length=length, kv_length=length,
        mask_function=masking_utils.sliding_window_bidirectional_mask_function(window),
        attention_mask=None if padding is None else padding.bool(), allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False, dtype=embeds.dtype,
    )
    assert torch.equal(bidirectional_sliding_window_mask(embeds, padding, window, additive), reference)


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("q_len,q_offset,kv_len,kv_offset", [(5, 0, 5, 0), (1, 9, 10, 0), (1, 9, 4, 6), (3, 6, 6, 3), (2, 0, 2, 0)])
def test_cached_causal_mask_equals_transformers_with_offsets(q_len, q_offset, kv_len, kv_offset, window, additive):
    """Queries at q_offset.., keys at kv_offset.. (a sliding cache drops its first tokens), padding over every token seen."""
    batch, seen = 2, q_offset + q_len
    padding = torch.ones(batch, seen, dtype=torch.long)
    padding[1, :2] = 0  # the second row is left padded
    embeds = torch.randn(batch, q_len, 8)
    function = masking_utils.causal_mask_function if window is None else masking_utils.sliding_window_causal_mask_function(window)
    reference = (masking_utils.eager_mask if additive else masking_utils.sdpa_mask)(
        batch_size=batch, q_length=q_len, kv_length=kv_len, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
        attention_mask=padding.bool(), allow_is_causal_skip=False, dtype=embeds.dtype,
    )
    assert torch.equal(cached_causal_attention_mask(embeds, padding, q_offset, kv_offset, kv_len, window, additive), reference)


def test_leaf_functions_are_self_contained_torch_only_code():
    tree = ast.parse(inspect.getsource(torch_functions))
    imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imports |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imports <= {"torch", "math", "operator", "__future__"}
    for function in LEAF_FUNCTIONS:
        namespace = {"torch": torch}
        exec(compile(inspect.getsource(function), "<copied>", "exec"), namespace)  # noqa: S102 - the artifact writer does this
        names = {node.id for node in ast.walk(ast.parse(inspect.getsource(function))) if isinstance(node, ast.Name)}
        assert not names & {f.__name__ for f in LEAF_FUNCTIONS} - {function.__name__}
        copied = namespace[function.__name__]
        args = _sample_arguments()[function]
        assert _same(copied(*args), function(*args))


def _sample_arguments() -> dict:
    """One call of each leaf function."""
    embeds = torch.randn(2, 5, 4)
    mask = torch.ones(2, 5, dtype=torch.long)
    return {
        bidirectional_attention_mask: (mask, embeds, embeds, True),
        causal_attention_mask: (embeds, mask, None, True),
        bidirectional_sliding_window_mask: (embeds, mask, 2, True),
        cached_causal_attention_mask: (embeds, mask, 0, 0, 5, None, True),
        check_condition: (torch.tensor([True, True]), "checked"),
    }


def _same(a, b) -> bool:
    return a is None and b is None or torch.equal(a, b)


def test_every_leaf_function_has_a_sample_call():
    assert set(_sample_arguments()) == set(LEAF_FUNCTIONS)


@pytest.mark.parametrize("condition", [False, torch.tensor([True, False])])
def test_check_condition_raises_the_models_message(condition):
    with pytest.raises(ValueError, match="^All examples must have the same number of <eos> tokens.$"):
        check_condition(condition, "All examples must have the same number of <eos> tokens.")
