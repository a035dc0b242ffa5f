"""Greedy decoding over a flat decoder step: token for token what ``model.generate(do_sample=False)`` makes.

A step is any callable (a ``FlatCacheDecoder``, the GraphModule of its export, an ONNX
Runtime adapter) taking and returning flat tensors, in the order of ``aot.decoding.names``::

    step(input_ids, attention_mask, [position_ids,] *past) -> (logits, *present)

What transformers 5's ``generate`` does, and so what :func:`greedy_generate` does:

- the prompt is left padded: ``attention_mask`` is 0 on the padding, which the model sees
  but never attends to;
- ``position_ids = cumsum(attention_mask) - 1``, 0 where padded (generate's
  ``_prepare_position_ids_for_generation``); each new token is at the last position + 1;
- the first step (prefill) takes the whole prompt and an empty past; every later step one
  token, the previous step's present as its past, and the mask one column of ones longer;
- the next token is ``argmax`` of the last position's logits in float32 (the first index
  of the maximum on a tie, as ``torch.argmax`` is for both);
- with ``eos_token_id``: a row that produced an EOS token gets ``pad_token_id`` (default: the
  first EOS id, as generate defaults it) from then on, and the loop stops once every row
  has one. Without it, exactly ``max_new_tokens`` tokens.

torch and the standard library only, and no import from aot: an artifact writer pastes
this file into a torch-only module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Step = Callable[..., Sequence[torch.Tensor]]


@dataclass(frozen=True)
class PastLayout:
    """The flat past a step takes: ``(kv_heads, head_dim)`` per layer, its dtype, whether ``position_ids`` is an input."""

    heads_and_dims: tuple[tuple[int, int], ...]
    dtype: torch.dtype = torch.float32
    takes_position_ids: bool = True

    @property
    def num_layers(self) -> int:
        return len(self.heads_and_dims)

    def empty(self, batch: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """The prefill's past: a key and a value of length 0 per layer, shape (batch, kv_heads, 0, head_dim)."""
        past = []
        for heads, head_dim in self.heads_and_dims:
            empty = torch.zeros((batch, heads, 0, head_dim), dtype=self.dtype, device=device)
            past += [empty, empty.clone()]
        return past


def prompt_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of a left-padded prompt as generate computes them: count of real tokens before, 0 on padding."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def greedy_generate(
    step: Step,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    *,
    past_layout: PastLayout,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> torch.Tensor:
    """The prompt followed by the generated tokens, (batch, prompt + new), as ``generate`` returns it; see the module docstring."""
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be (batch, sequence); got {tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    eos = _eos_tensor(eos_token_id, input_ids.device)
    if eos is not None and pad_token_id is None:
        pad_token_id = int(eos[0])
    batch = input_ids.shape[0]
    attention_mask = attention_mask.long()
    past = past_layout.empty(batch, input_ids.device)
    step_ids, positions = input_ids, prompt_position_ids(attention_mask)
    unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    generated: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            leading = (step_ids, attention_mask, positions) if past_layout.takes_position_ids else (step_ids, attention_mask)
            logits, *past = step(*leading, *past)
            next_tokens = torch.argmax(logits[:, -1, :].to(torch.float32), dim=-1)
            if eos is not None:
                next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad_token_id))
                unfinished = unfinished & ~torch.isin(next_tokens, eos)
            generated.append(next_tokens)
            if eos is not None and not bool(unfinished.any()):
                break
            step_ids = next_tokens[:, None]
            positions = positions[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
    return torch.cat([input_ids, torch.stack(generated, dim=1).to(input_ids.dtype)], dim=1)


def _eos_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> torch.Tensor | None:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


@dataclass(frozen=True)
class Divergence:
    """Where two generations first differ: the batch ``row``, the 0-based index of the new token, both tokens.

    A token is ``None`` where that generation had already ended (it stopped at EOS earlier).
    """

    row: int
    new_token_index: int
    expected: int | None
    actual: int | None

    def describe(self, runner: str, prompt: str, reference: str = "eager generate") -> str:
        """One line, e.g. ``graph_module: tokens differ from eager generate at new token 17 of prompt 'len 9, batch 2', row 1 (...)``."""
        shown = {"expected": self.expected, "actual": self.actual}
        tokens = {key: "end" if value is None else str(value) for key, value in shown.items()}
        return (
            f"{runner}: tokens differ from {reference} at new token {self.new_token_index + 1} of prompt '{prompt}', "
            f"row {self.row} ({reference} {tokens['expected']}, {runner} {tokens['actual']})"
        )


def first_divergence(expected: torch.Tensor, actual: torch.Tensor, prompt_length: int) -> Divergence | None:
    """The first new token (earliest step, then lowest row) where ``actual`` differs from ``expected``; ``None`` if equal.

    Both are (batch, prompt_length + new) as :func:`greedy_generate` and ``generate`` return them;
    they may differ in length when one stopped at EOS earlier. Their prompts must be equal.
    """
    if expected.dim() != 2 or actual.dim() != 2 or expected.shape[0] != actual.shape[0]:
        raise ValueError(f"expected and actual must be (batch, length) of one batch; got {tuple(expected.shape)} and {tuple(actual.shape)}")
    if not torch.equal(expected[:, :prompt_length], actual[:, :prompt_length]):
        raise ValueError("expected and actual do not start with the same prompt")
    new_expected, new_actual = expected[:, prompt_length:], actual[:, prompt_length:]
    for index in range(max(new_expected.shape[1], new_actual.shape[1])):
        for row in range(expected.shape[0]):
            want = int(new_expected[row, index]) if index < new_expected.shape[1] else None
            got = int(new_actual[row, index]) if index < new_actual.shape[1] else None
            if want != got:
                return Divergence(row, index, want, got)
    return None
