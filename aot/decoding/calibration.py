"""Calibration inputs: the recipe's ``generation.calibration`` texts as the decoder step's prefills.

A pass that fits to data (``quantize_linear_weights`` with ``method: gptq``) runs the traced graph
on them while it works; :func:`calibration_inputs` makes them as the graph is called: keyword
tensors under the step's input names, one text a call (batch 1, so no padding row skews what a
layer sees), with a past of length 0.
"""

from __future__ import annotations

import torch

from .greedy import prompt_position_ids


def calibration_inputs(step, prompts: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """``step``: the build's :class:`~aot.decoding.keyword_step.DecoderStep`; ``prompts``: the texts' ids, (1, T) each
    (:func:`~aot.decoding.fidelity.tokenized_prompts`), as the step's inputs."""
    layout = step.decoder.past_layout
    made = []
    for ids in prompts:
        mask = torch.ones_like(ids)
        leading = [ids, mask, prompt_position_ids(mask)] if layout.takes_position_ids else [ids, mask]
        made.append(dict(zip(step.input_names, [*leading, *layout.empty(1)])))
    return made
