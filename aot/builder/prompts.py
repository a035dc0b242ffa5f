"""The texts a decoder build runs through its model beside its tests: the fidelity gate's prompts and the calibration
texts, as the shipped tokenizer gives them. Made here for the build, and by ``aot check`` to find, without a build,
a file whose texts are all too short to use."""

from __future__ import annotations

import torch

from aot.inputs import text_lines
from aot.models import load_tokenizer
from aot.recipe.plan import CalibrationPlan, FidelityPlan


def fidelity_prompts(plan: FidelityPlan) -> list[torch.Tensor]:
    """The gate's first ``max_prompts`` prompts, cut to ``max_prompt_tokens``, (1, T) each; an error names the prompts
    file when none has two tokens (the first predicts the second)."""
    from aot.decoding.fidelity import tokenized_prompts

    spec = plan.spec
    prompts = tokenized_prompts(text_lines(plan.prompts_path)[: spec.max_prompts], load_tokenizer(plan.tokenizer), spec.max_prompt_tokens)
    if not prompts:
        raise plan.locator.error(("generation", "fidelity", "prompts"), "no prompt of two tokens or more")
    return prompts


def calibration_prompts(plan: CalibrationPlan) -> list[torch.Tensor]:
    """The first ``max_texts`` calibration texts, cut to ``max_tokens``, (1, T) each; an error names the texts file when
    none has two tokens."""
    from aot.decoding.fidelity import tokenized_prompts

    spec = plan.spec
    prompts = tokenized_prompts(text_lines(plan.texts_path)[: spec.max_texts], load_tokenizer(plan.tokenizer), spec.max_tokens)
    if not prompts:
        raise plan.locator.error(("generation", "calibration", "texts"), "no text of two tokens or more")
    return prompts
