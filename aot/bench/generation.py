"""Timing a decoder build's runners as they generate: time to the first token, then each next token.

A decoder step serves two very different calls: the prefill (the whole prompt, an empty
past) and a decode step (one token, the past so far). ``aot bench`` on a build with
``generation.cache`` times a greedy generation of ``new_tokens`` tokens per call and splits it:

- ``prefill``: from the call to the first token's logits (time to first token);
- ``decode``: the mean time of each later token (1000 / that is tokens per second).

Both are stamped the same way for every runner, right after a step's logits exist:

- ``eager``: ``model.generate(do_sample=False)`` with its own cache; a logits processor, which
  generate calls once a step right after the forward, takes the stamp;
- ``graph_module``: the saved step through ``module.py``, under :func:`aot.decoding.greedy.greedy_generate`
  (the loop ``module.py``'s ``generate`` runs), the stamp taken as each step returns;
- ``onnx``: the ONNX model in an ONNX Runtime session with the bench's threads, the same loop.

Each loop's own work between steps (token choice, mask growth) falls inside the decode time,
generate's as much as the artifacts'. Prompts are seeded random ids, unpadded, ``prompt``
tokens long, ``batch`` rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aot.decoding.generation_check import eager_greedy, stepwise

PREFILL, DECODE = "prefill", "decode"


def prompt_inputs(vocab_size: int, shape: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (shape["batch"], shape["prompt"]), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def timed_generation(generate: Callable[[torch.Tensor, torch.Tensor, int, Callable[[], None]], Any], new_tokens: int):
    """``run(inputs) -> {prefill_ms, decode_ms}``: ``generate(ids, mask, n, stamp)`` must call ``stamp()`` after every step's logits."""

    def run(inputs: dict[str, torch.Tensor]) -> dict[str, float]:
        stamps: list[float] = []
        started = time.perf_counter()
        with torch.inference_mode():
            generate(inputs["input_ids"], inputs["attention_mask"], new_tokens, lambda: stamps.append(time.perf_counter()))
        if len(stamps) != new_tokens:
            raise RuntimeError(f"the generation made {len(stamps)} steps, not {new_tokens}")
        return {PREFILL: (stamps[0] - started) * 1000, DECODE: (stamps[-1] - stamps[0]) * 1000 / (new_tokens - 1)}

    return run


def eager_generate(causal_lm: torch.nn.Module):
    from transformers import LogitsProcessor, LogitsProcessorList

    class Stamp(LogitsProcessor):
        def __init__(self, stamp: Callable[[], None]):
            self.stamp = stamp

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.stamp()
            return scores

    def generate(input_ids, attention_mask, new_tokens, stamp):
        return eager_greedy(causal_lm, input_ids, attention_mask, new_tokens, logits_processor=LogitsProcessorList([Stamp(stamp)]))

    return generate


def step_generate(step: Callable[..., Any], past_layout) -> Callable:
    """Greedy generation over a flat step (the loop the build validates with), stamping as each step returns."""

    def generate(input_ids, attention_mask, new_tokens, stamp):
        def stamped(*tensors):
            outputs = step(*tensors)
            stamp()
            return outputs

        return stepwise(stamped, past_layout)(input_ids, attention_mask, new_tokens)

    return generate


def graph_module_step(saved: torch.nn.Module, input_names: list[str]) -> Callable:
    return lambda *tensors: list(saved(**dict(zip(input_names, tensors))).values())


def onnx_step(path: Path, threads: int):
    import onnxruntime

    from aot.decoding.onnx_step import OnnxStep

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    return OnnxStep(path, session_options=options)
