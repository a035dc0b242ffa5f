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

Ties. Where eager's two best logits are closer than float rounding, a kernel that sums in
another order (oneDNN against MKL, ONNX Runtime against torch) may pick the other token, and
from there the two texts differ although neither artifact is wrong (measured: GPT-2's
recipe, a margin of 2.9e-6 between the two best logits at new token 23). So a divergence is
looked at again, with the artifact's step fed eager's tokens (teacher forcing): at every
step, eager's token must be the artifact's best, or within the step tolerance of it
(``atol + rtol * |best logit|``, the recipe's ``validate`` tolerances). The check passes only
if all ``new_tokens`` steps agree that way; the report names each tie and its margin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from aot.errors import first_line

from .greedy import Divergence, PastLayout, first_divergence, greedy_generate, prompt_position_ids

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
    judged_by: str | None = None  # "fidelity gate" where exact tokens are recorded, not required

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


@dataclass(frozen=True)
class ForcedStep:
    """An artifact's bare step, to re-run a divergence on eager's tokens, and the tolerance of a tie."""

    step: Callable[..., Sequence[torch.Tensor]]
    past_layout: PastLayout
    atol: float
    rtol: float


def check_generation(
    artifact: str,
    generate: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    checked: Sequence[Prompt],
    references: Sequence[torch.Tensor],
    new_tokens: int,
    forced: ForcedStep | None = None,
) -> list[GenerationCheck]:
    """``generate(input_ids, attention_mask, new_tokens)``'s tokens against each reference.

    An artifact that raises fails that prompt, named with the error's first line. With
    ``forced``, a divergence passes if it was a tie (see the module docstring).
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
        if divergence is None:
            results.append(GenerationCheck(artifact, prompt.label, new_tokens, True))
        elif forced is None:
            results.append(GenerationCheck(artifact, prompt.label, new_tokens, False, divergence.describe(artifact, prompt.label)))
        else:
            results.append(_judge_divergence(artifact, prompt, reference, divergence, forced))
    return results


def _judge_divergence(artifact: str, prompt: Prompt, reference: torch.Tensor, divergence: Divergence, forced: ForcedStep) -> GenerationCheck:
    """Whether a divergence was a tie: the artifact's step on eager's tokens agrees at every step, ties allowed."""
    new_tokens = reference[:, prompt.input_ids.shape[1]:]
    with torch.no_grad():
        logits = forced_logits(forced.step, forced.past_layout, prompt, new_tokens)
    best = logits.max(dim=-1).values
    gap = best - logits.gather(-1, new_tokens[..., None]).squeeze(-1)  # 0 where eager's token is the artifact's best
    allowed = forced.atol + forced.rtol * best.abs()
    count = new_tokens.shape[1]
    if bool((gap > allowed).any()):
        row, index = (int(i) for i in (gap > allowed).nonzero()[0])
        message = (
            f"{divergence.describe(artifact, prompt.label)}; not a tie: fed eager's tokens, at new token {index + 1} of row {row} "
            f"eager's token scores {float(gap[row, index]):.3g} below the artifact's best (tolerance {float(allowed[row, index]):.3g})"
        )
        return GenerationCheck(artifact, prompt.label, count, False, message)
    ties = [(int(row), int(index)) for row, index in (gap > 0).nonzero()]
    named = ", ".join(f"new token {index + 1} of row {row} (margin {float(gap[row, index]):.2g})" for row, index in ties)
    message = (
        f"{artifact}: {count} tokens as eager generate on prompt '{prompt.label}', ties within atol+rtol taken as eager took them: {named}"
    )
    return GenerationCheck(artifact, prompt.label, count, True, message)


def forced_logits(step, past_layout: PastLayout, prompt: Prompt, new_tokens: torch.Tensor) -> torch.Tensor:
    """The step's last-position logits (float32) at each new token, (batch, new, vocab), when fed ``new_tokens`` (teacher forcing)."""
    batch = prompt.input_ids.shape[0]
    attention_mask = prompt.attention_mask.long()
    step_ids, positions = prompt.input_ids, prompt_position_ids(attention_mask)
    past = past_layout.empty(batch)
    logits_per_step = []
    for index in range(new_tokens.shape[1]):
        leading = (step_ids, attention_mask, positions) if past_layout.takes_position_ids else (step_ids, attention_mask)
        logits, *past = step(*leading, *past)
        logits_per_step.append(logits[:, -1, :].to(torch.float32))
        step_ids = new_tokens[:, index : index + 1]
        positions = positions[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
    return torch.stack(logits_per_step, dim=1)


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
    atol: float  # a tie: eager's token within atol + rtol * |best| of the artifact's best logit
    rtol: float
    fidelity: Any = None  # a FidelityReference where the recipe gates on fidelity (aot.decoding.fidelity)

    @classmethod
    def take(cls, step, prompt_lengths: Sequence[int], new_tokens: int, seed: int, atol: float, rtol: float,
             fidelity: Callable[[torch.nn.Module], Any] | None = None) -> GenerationReference:
        """``step``: the build's :class:`~aot.decoding.keyword_step.DecoderStep`; ``atol``/``rtol``: the step's tolerances;
        ``fidelity``: takes the fidelity gate's reference from the causal LM, where the recipe has one."""
        made = prompts(prompt_lengths, step.config.vocab_size, seed)
        tokens = [eager_tokens(step.causal_lm, prompt, new_tokens) for prompt in made]
        reference = fidelity(step.causal_lm) if fidelity is not None else None
        return cls(made, tokens, new_tokens, step.artifact_meta(), atol, rtol, reference)

    def check_files(self, directory: Path, open_graph_module: Callable[[Path], torch.nn.Module]) -> list[GenerationCheck]:
        """``model.onnx`` through plain ONNX Runtime, ``graph_module/`` through its ``module.py``'s own ``generate``.

        ``open_graph_module(folder)``: the saved GraphModule as users load it (the artifact's own ``open``, which the
        layers above this one own: decoding knows steps, not artifact kinds).
        """
        from aot.process.memory import release_freed_memory

        from .onnx_step import OnnxStep

        results = []
        if (directory / "model.onnx").is_file():
            onnx_step = OnnxStep(directory / "model.onnx")
            forced = ForcedStep(onnx_step, onnx_step.past_layout, self.atol, self.rtol)
            results += self._checked("onnx", stepwise(onnx_step, onnx_step.past_layout), forced)
            del onnx_step, forced
            release_freed_memory()  # ONNX Runtime's session, gone: its heap pages, before the GraphModule's
        module_file = "graph_module/module.py"
        if (directory / module_file).is_file():
            saved = open_graph_module(directory / "graph_module")
            forced = ForcedStep(self._keyword_step(saved), self._past_layout(), self.atol, self.rtol)
            results += self._checked("graph_module", saved.generate, forced)
        return results

    def _checked(self, artifact: str, generate, forced: ForcedStep) -> list:
        """Exact tokens against eager's; with a fidelity gate, those are recorded and the gate decides."""
        results = check_generation(artifact, generate, self.prompts, self.tokens, self.new_tokens, None if self.fidelity else forced)
        if self.fidelity is None:
            return results
        for result in results:
            result.ok, result.judged_by = True, "fidelity gate"
        return [*results, self.fidelity.measure(artifact, forced.step, forced.past_layout, generate)]

    def _keyword_step(self, saved: torch.nn.Module):
        """The saved step, which takes keywords and returns a dict, as a flat step (as ``module.py``'s generate calls it)."""
        names = self.artifact_meta["inputs"]
        return lambda *tensors: list(saved(**dict(zip(names, tensors))).values())

    def _past_layout(self) -> PastLayout:
        meta = self.artifact_meta
        pairs = tuple(tuple(pair) for pair in meta["heads_and_dims"])
        return PastLayout(pairs, getattr(torch, meta["dtype"]), meta["takes_position_ids"])
