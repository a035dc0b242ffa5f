"""Tiny causal LMs (seed 0) and prompts for the decoding tests, with eager ``generate`` as the reference.

Every model is built once per session (``decoder(name)``), exported once (``program(name)``):
the tests share them. Weights are drawn wider than transformers' default (``initializer_range``)
so that a random model's greedy tokens vary from step to step instead of repeating one token,
and a wrong cache shows as different tokens.
"""

from __future__ import annotations

import functools

import torch
import transformers

from aot.decoding.export_spec import export_program
from aot.decoding.flat_cache import FlatCacheDecoder

VOCAB = 128
PAD = 0
NEW_TOKENS = 32
WINDOW = 8
PROMPT_LENGTHS = (5, 11)  # Mistral's window of 8 lies between them: a prefill inside and one past it
_INIT = 0.2
_COMMON = {"vocab_size": VOCAB, "num_hidden_layers": 2, "initializer_range": _INIT}


def _gpt2() -> transformers.PreTrainedModel:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=128, n_embd=64, n_head=4, **_COMMON))


def _llama() -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **_COMMON
    )
    return transformers.LlamaForCausalLM(config)


def mistral(window: int | None = WINDOW) -> transformers.PreTrainedModel:
    """Tiny Mistral, every layer attending to the last ``window`` tokens (``None``: all of them)."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        sliding_window=window, **_COMMON,
    )
    return transformers.MistralForCausalLM(config).eval()


def _seeded(build):
    def built() -> transformers.PreTrainedModel:
        torch.manual_seed(0)
        return build().eval()

    return built


MODELS = {"gpt2": _seeded(_gpt2), "llama": _seeded(_llama), "mistral_window_8": mistral}


@functools.cache
def decoder(name: str) -> FlatCacheDecoder:
    return FlatCacheDecoder(MODELS[name]())


@functools.cache
def program(name: str) -> torch.export.ExportedProgram:
    return export_program(decoder(name))


def prompts() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(label, input_ids, attention_mask)``: each length at batch 1, and at batch 2 with row 1 left padded by 3."""
    generator = torch.Generator().manual_seed(0)
    cases = []
    for length in PROMPT_LENGTHS:
        ids = torch.randint(3, VOCAB, (2, length), generator=generator)
        mask = torch.ones_like(ids)
        ids[1, :3], mask[1, :3] = PAD, 0
        cases.append((f"len {length}, batch 1", ids[:1].clone(), mask[:1].clone()))
        cases.append((f"len {length}, batch 2, row 1 left padded by 3", ids, mask))
    return cases


def eager_generate(model, input_ids, attention_mask, new_tokens: int = NEW_TOKENS, eos_token_id=None) -> torch.Tensor:
    """``model.generate`` greedy; without ``eos_token_id`` it makes exactly ``new_tokens`` tokens."""
    with torch.no_grad():
        tokens = model.generate(
            input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new_tokens, eos_token_id=eos_token_id, pad_token_id=PAD
        )
    if eos_token_id is None:
        assert tokens.shape == (input_ids.shape[0], input_ids.shape[1] + new_tokens), "generate stopped early"
    return tokens
