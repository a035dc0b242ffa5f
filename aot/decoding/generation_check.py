"""Validation by generation: each artifact must make exactly the tokens eager ``generate`` makes.

A per-step comparison of logits can pass while decoding goes wrong (a sliding-window cache
that grows without bound still gives the right logits for one step), so a decoder build also
generates. For every prompt length of the recipe's ``generation`` section:

- batch 1, the prompt alone;
- batch 2, the prompt and a second one two tokens shorter, left padded (``attention_mask`` 0
  on the padding), as ``generate`` takes a batch of unequal prompts.

Eager ``model.generate(do_sample=False)`` makes the reference, ``new_tokens`` tokens with no
end-of-sequence stop (so every step is compared, whatever the random weights emit); each
artifact's step runs :func:`aot.decoding.greedy.greedy_generate` over the same prompts. The
first step where tokens differ is named (:class:`~aot.decoding.greedy.Divergence`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from aot.errors import first_line

from .greedy import PastLayout, first_divergence, greedy_generate

_SHORTER_BY = 2  # the batch-2 prompts' second row: this much left padding


@dataclass(frozen=True)
class Prompt:
    label: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass
class GenerationCheck:
    """One artifact on one prompt: whether its tokens were eager's, and where they first differed."""

    artifact: str
    prompt: str
    new_tokens: int
    ok: bool
    message: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return self.message or f"{self.artifact}: {self.new_tokens} tokens as eager generate on prompt '{self.prompt}'"


def prompts(lengths: Sequence[int], vocab_size: int, seed: int) -> list[Prompt]:
    """For each length: batch 1, then batch 2 with the second row left padded; seeded token ids."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for length in lengths:
        ids = torch.randint(0, vocab_size, (2, length), generator=generator)
        made.append(Prompt(f"length {length}, batch 1", ids[:1].clone(), torch.ones((1, length), dtype=torch.long)))
        padding = min(_SHORTER_BY, length - 1)
        mask = torch.ones((2, length), dtype=torch.long)
        mask[1, :padding] = 0
        padded = ids.masked_fill(mask == 0, 0)
        made.append(Prompt(f"length {length}, batch 2, row 1 left padded by {padding}", padded, mask))
    return made


def eager_tokens(causal_lm: torch.nn.Module, prompt: Prompt, new_tokens: int) -> torch.Tensor:
    """``generate(do_sample=False)``: exactly ``new_tokens`` tokens (no end-of-sequence stop), prompt included."""
    with torch.no_grad():
        return eager_greedy(causal_lm, prompt.input_ids, prompt.attention_mask, new_tokens)


def eager_greedy(causal_lm: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int, **options):
    """Eager ``generate`` as every check and bench here runs it: greedy, ``new_tokens`` tokens, no EOS stop.

    ``options``: more of ``generate``'s arguments (the bench's timing ``logits_processor``).
    """
    return causal_lm.generate(
        input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
        **options,
    )


def check_generation(
    artifact: str,
    generate: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    checked: Sequence[Prompt],
    references: Sequence[torch.Tensor],
    new_tokens: int,
) -> list[GenerationCheck]:
    """``generate(input_ids, attention_mask, new_tokens)``'s tokens against each reference.

    An artifact that raises fails that prompt, named with the error's first line.
    """
    results = []
    for prompt, reference in zip(checked, references):
        try:
            with torch.no_grad():
                tokens = generate(prompt.input_ids, prompt.attention_mask, new_tokens)
        except Exception as error:  # reported as this artifact's failure on this prompt, beside the other checks
            message = f"{artifact}: generation on prompt '{prompt.label}' fails: {type(error).__name__}: {first_line(error)}"
            results.append(GenerationCheck(artifact, prompt.label, new_tokens, False, message))
            continue
        divergence = first_divergence(reference, tokens, prompt.input_ids.shape[1])
        message = None if divergence is None else divergence.describe(artifact, prompt.label)
        results.append(GenerationCheck(artifact, prompt.label, new_tokens, divergence is None, message))
    return results


def stepwise(step: Callable[..., Sequence[torch.Tensor]], past_layout: PastLayout):
    """``generate(input_ids, attention_mask, new_tokens)`` for a bare step (an ONNX Runtime session)."""
    return lambda input_ids, attention_mask, new_tokens: greedy_generate(
        step, input_ids, attention_mask, new_tokens, past_layout=past_layout
    )


@dataclass
class GenerationReference:
    """Eager's tokens on the recipe's prompts, taken before the eager model goes; checks the written artifacts."""

    prompts: list[Prompt]
    tokens: list[torch.Tensor]
    new_tokens: int
    artifact_meta: dict

    @classmethod
    def take(cls, step, prompt_lengths: Sequence[int], new_tokens: int, seed: int) -> GenerationReference:
        """``step``: the build's :class:`~aot.decoding.keyword_step.DecoderStep`."""
        made = prompts(prompt_lengths, step.config.vocab_size, seed)
        tokens = [eager_tokens(step.causal_lm, prompt, new_tokens) for prompt in made]
        return cls(made, tokens, new_tokens, step.artifact_meta())

    def check_files(self, directory: Path, sha256_of: Callable[[str], str | None]) -> list[GenerationCheck]:
        """``model.onnx`` through plain ONNX Runtime, ``graph_module/`` through its ``module.py``'s own ``generate``."""
        from aot import export

        from .onnx_step import OnnxStep

        results = []
        if (directory / "model.onnx").is_file():
            onnx_step = OnnxStep(directory / "model.onnx")
            results += check_generation("onnx", stepwise(onnx_step, onnx_step.past_layout), self.prompts, self.tokens, self.new_tokens)
            del onnx_step
        module_file = "graph_module/module.py"
        if (directory / module_file).is_file():
            saved = export.load_standalone(directory / "graph_module", sha256_of(module_file), keep_freed_memory=False)
            results += check_generation("graph_module", saved.generate, self.prompts, self.tokens, self.new_tokens)
        return results
