"""The texts a decoder build runs through its model beside its tests: the fidelity gate's prompts and the calibration
texts, as the shipped tokenizer gives them. Made here for the build, and by ``aot check`` to find, without a build,
a file whose texts are all too short to use."""

from __future__ import annotations

from pathlib import Path

import torch

from aot.inputs import text_lines
from aot.models import load_tokenizer
from aot.recipe.locator import Located
from aot.recipe.plan import CalibrationPlan, FidelityPlan


def fidelity_prompts(plan: FidelityPlan) -> list[torch.Tensor]:
    """The gate's first ``max_prompts`` prompts, cut to ``max_prompt_tokens``, (1, T) each."""
    spec = plan.spec
    return _token_rows(plan.prompts_path, plan.tokenizer, spec.max_prompts, spec.max_prompt_tokens,
                       plan.locator.error(("generation", "fidelity", "prompts"), "no prompt of two tokens or more"))


def calibration_prompts(plan: CalibrationPlan) -> list[torch.Tensor]:
    """The first ``max_texts`` calibration texts, cut to ``max_tokens``, (1, T) each."""
    spec = plan.spec
    return _token_rows(plan.texts_path, plan.tokenizer, spec.max_texts, spec.max_tokens,
                       plan.locator.error(("generation", "calibration", "texts"), "no text of two tokens or more"))


def _token_rows(path: Path, tokenizer: Located, count: int | None, max_tokens: int, none_long_enough: Exception) -> list[torch.Tensor]:
    """The first ``count`` lines of ``path`` (all when None) as the tokenizer's ids, cut to ``max_tokens``; those under
    two tokens left out (the first predicts the second), and ``none_long_enough`` raised when none is left."""
    from aot.decoding.fidelity import tokenized_prompts

    rows = tokenized_prompts(text_lines(path)[:count], load_tokenizer(tokenizer), max_tokens)
    if not rows:
        raise none_long_enough
    return rows
