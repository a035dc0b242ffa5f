"""Fidelity gates: a decoder whose passes change the computation, scored against the float32 eager model.

Weight-only int4 moves every weight by up to half a step, so no artifact makes eager's exact logits,
and over a long generation not always eager's exact tokens either. What a user needs is that it
predicts as the model does. On the recipe's prompts (``generation.fidelity.prompts``, real text
through the shipped tokenizer, each cut to ``max_prompt_tokens``), for each artifact:

- **teacher forced**, at every position ``t`` of every prompt: eager's next-token distribution
  ``p_t = softmax(eager logits)`` and the artifact's ``q_t``, both given the prompt's true tokens
  up to ``t``, the artifact fed them one a call (decode steps, through its KV cache):

  - ``kl_mean``: the mean over all positions of ``KL(p_t || q_t) = Σ_v p_t(v) (log p_t(v) - log q_t(v))``
    in nats, and ``kl_max`` the largest;
  - ``top1_agreement``: the share of positions where ``argmax q_t = argmax p_t``;

- **prefilled**: the same positions, each given the tokens up to ``t`` in one call (a prompt's
  prefill: one call of the whole prompt where the step gives every position's logits, else one
  call per prefix): ``prefill_kl_mean``, ``prefill_kl_max``, ``prefill_top1_agreement``, held to
  the same thresholds. An artifact may compute a call of many tokens another way than a decode step
  (the weight-only GraphModule's int8 GEMMs for more than 8 rows): both ways are what users run;

- **greedy**: ``greedy_agreement``, the mean over prompts of the share of ``new_tokens`` greedy
  tokens the artifact makes before its first token that differs from eager's (after a difference
  the two continue from different texts, so later matches mean little).

Scores work with random weights as with real ones: a random model's distributions are flatter,
so its KL is smaller and its top-1 choices closer to ties. The recipe sets thresholds; each
artifact must meet every one given, or the build fails (exit 5) naming the metric.

Eager's log-probabilities are kept in float16 between taking them and scoring the artifacts
(the eager model is gone by then): 11 significant bits, so ``log p`` near 0, where the
probability mass is, keeps its error under 1e-3 and KL its accuracy to about that much.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

from aot.errors import first_line

from .generation_check import Prompt, eager_greedy, forced_logits
from .greedy import PastLayout

# metric -> (threshold in FidelitySpec, whether it is a ceiling (True) or a floor)
METRICS = {
    "kl_mean": ("max_kl_mean", True),
    "kl_max": ("max_kl", True),
    "top1_agreement": ("min_top1_agreement", False),
    "prefill_kl_mean": ("max_kl_mean", True),
    "prefill_kl_max": ("max_kl", True),
    "prefill_top1_agreement": ("min_top1_agreement", False),
    "greedy_agreement": ("min_greedy_agreement", False),
}


def metric_thresholds(limits: Mapping[str, float | None]) -> dict[str, float]:
    """Each metric's threshold from the recipe's (``max_kl_mean``... as ``generation.fidelity`` names them; None
    where not given): one recipe threshold holds both ways of feeding the prompts."""
    return {metric: limits[key] for metric, (key, _) in METRICS.items() if limits.get(key) is not None}


@dataclass
class FidelityResult:
    """One artifact's fidelity scores, the recipe's thresholds, and whether it met them."""

    artifact: str
    prompts: int
    positions: int
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    problem: str | None = None  # the artifact failed to run on the prompts

    @property
    def failed(self) -> list[str]:
        def misses(name: str) -> bool:
            value, ceiling = self.metrics.get(name), METRICS[name][1]
            return value is None or (value > self.thresholds[name] if ceiling else value < self.thresholds[name])

        return [name for name in self.thresholds if misses(name)]

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.failed

    def summary(self) -> str:
        where = f"on {self.prompts} prompts, {self.positions} positions"
        if self.problem:
            return f"{self.artifact}: fidelity gate: {self.problem} ({where})"
        shortfalls = ", ".join(
            f"{name} {self.metrics.get(name, float('nan')):.4f} {'above' if METRICS[name][1] else 'below'} {self.thresholds[name]:g}"
            for name in self.failed
        )
        return f"{self.artifact}: fidelity gate: {shortfalls or 'met'} ({where})"

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok, "failed": self.failed}


@dataclass
class FidelityReference:
    """Eager's log-probabilities and greedy tokens on the fidelity prompts: taken before the eager model goes."""

    prompts: list[torch.Tensor]  # (1, T) token ids each
    log_probs: list[torch.Tensor]  # (T, vocab) float16: eager's next-token log-probabilities at each position
    greedy: list[torch.Tensor]  # (new_tokens,) eager's greedy continuation of each prompt
    new_tokens: int
    thresholds: dict[str, float]

    @classmethod
    def take(cls, causal_lm: torch.nn.Module, prompts: Sequence[torch.Tensor], new_tokens: int, thresholds: dict[str, float]) -> FidelityReference:
        log_probs, greedy = [], []
        with torch.no_grad():
            for ids in prompts:
                mask = torch.ones_like(ids)
                logits = causal_lm(input_ids=ids, attention_mask=mask).logits[0].to(torch.float32)
                log_probs.append(torch.log_softmax(logits, dim=-1).to(torch.float16))
                greedy.append(eager_greedy(causal_lm, ids, mask, new_tokens)[0, ids.shape[1]:])
        return cls(list(prompts), log_probs, greedy, new_tokens, thresholds)

    @property
    def positions(self) -> int:
        return sum(ids.shape[1] for ids in self.prompts)

    def measure(self, artifact: str, step: Callable[..., Sequence[torch.Tensor]], past_layout: PastLayout,
                generate: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> FidelityResult:
        """Score one artifact: its flat ``step`` teacher-forced over each prompt, its ``generate`` greedy."""
        result = FidelityResult(artifact, len(self.prompts), self.positions, thresholds=dict(self.thresholds))
        scores = {"": _Scores(), "prefill_": _Scores()}
        greedy = []
        try:
            with torch.no_grad():
                for ids, eager, tokens in zip(self.prompts, self.log_probs, self.greedy):
                    eager = eager.to(torch.float32)
                    scores[""].add(eager, teacher_forced_logits(step, past_layout, ids))
                    scores["prefill_"].add(eager, prefilled_logits(step, past_layout, ids))
                    made = generate(ids, torch.ones_like(ids), self.new_tokens)[0, ids.shape[1]:]
                    differ = (made != tokens).nonzero()
                    greedy.append((int(differ[0]) if len(differ) else self.new_tokens) / self.new_tokens)
        except Exception as error:  # reported as this artifact's failure, beside the other checks
            result.problem = f"fails to run: {type(error).__name__}: {first_line(error)}"
            return result
        metrics = {f"{way}{name}": value for way, way_scores in scores.items() for name, value in way_scores.metrics().items()}
        result.metrics = {name: metrics[name] for name in METRICS if name in metrics}
        result.metrics["greedy_agreement"] = sum(greedy) / len(greedy)
        return result


class _Scores:
    """KL divergences and top-1 agreements of one way of feeding the prompts, position by position."""

    def __init__(self) -> None:
        self.divergences: list[torch.Tensor] = []
        self.agreements: list[torch.Tensor] = []

    def add(self, eager: torch.Tensor, logits: torch.Tensor) -> None:
        mine = torch.log_softmax(logits, dim=-1)
        self.divergences.append((eager.exp() * (eager - mine)).sum(dim=-1).clamp(min=0))
        self.agreements.append(mine.argmax(dim=-1) == eager.argmax(dim=-1))

    def metrics(self) -> dict[str, float]:
        kl = torch.cat(self.divergences)
        return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                "top1_agreement": float(torch.cat(self.agreements).float().mean())}


def teacher_forced_logits(step: Callable[..., Sequence[torch.Tensor]], past_layout: PastLayout, ids: torch.Tensor) -> torch.Tensor:
    """The step's next-token logits at every position of ``ids`` (1, T), as (T, vocab) float32, fed one token a call:
    the first token as a prefill, then each next one as a decode step through the step's KV cache."""
    mask = torch.ones_like(ids)
    first = Prompt("teacher forced", ids[:, :1], mask[:, :1])
    # forced_logits reads the logits after each call and then feeds the next token of its list, so the list's last token
    # is never fed: the prompt's tokens 1 .. T-1, then any token, give positions 0 .. T-1
    return forced_logits(step, past_layout, first, torch.cat([ids[:, 1:], ids[:, :1]], dim=1))[0]


def prefilled_logits(step: Callable[..., Sequence[torch.Tensor]], past_layout: PastLayout, ids: torch.Tensor) -> torch.Tensor:
    """The step's next-token logits at every position ``t`` of ``ids`` (1, T), as (T, vocab) float32, given the tokens up
    to ``t`` in one call: the whole prompt's prefill where the step gives every position's logits (``generation.logits:
    all``; causal attention makes position ``t``'s the prefix's), otherwise (``last``) a prefill of each prefix."""
    logits = _prefill(step, past_layout, ids)
    if logits.shape[1] == ids.shape[1]:
        return logits[0].to(torch.float32)
    return torch.cat([_prefill(step, past_layout, ids[:, : end])[0, -1:] for end in range(1, ids.shape[1])]
                     + [logits[0, -1:]]).to(torch.float32)


def _prefill(step: Callable[..., Sequence[torch.Tensor]], past_layout: PastLayout, ids: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(ids)
    layout_inputs = (ids, mask, torch.arange(ids.shape[1])[None]) if past_layout.takes_position_ids else (ids, mask)
    return step(*layout_inputs, *past_layout.empty(1))[0]


def tokenized_prompts(lines: Sequence[str], tokenizer, max_tokens: int) -> list[torch.Tensor]:
    """Each prompt's ids as the shipped tokenizer gives them (no special tokens), cut to ``max_tokens``; (1, T) each."""
    made = []
    for line in lines:
        ids = tokenizer(line, add_special_tokens=False)["input_ids"][:max_tokens]
        if len(ids) >= 2:
            made.append(torch.tensor([ids], dtype=torch.long))
    return made
