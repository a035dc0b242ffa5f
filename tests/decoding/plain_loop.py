"""A user's own greedy loop over a decoder's model.onnx: onnxruntime and numpy only, nothing from aot."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plain_onnx_runtime_greedy(path: Path, prompt: np.ndarray, mask: np.ndarray, new_tokens: int) -> tuple[np.ndarray, int]:
    """``(tokens (batch, new_tokens), longest past seen)``: Optimum's decoder-with-past inputs, fed by hand."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past_key_values.")]
    assert outputs[0] == "logits" and len(pasts) == len(outputs) - 1 >= 2, (list(inputs), outputs)
    batch = prompt.shape[0]
    past = {n: np.zeros((batch, inputs[n].shape[1], 0, inputs[n].shape[3]), np.float32) for n in pasts}
    ids, positions, longest_past, tokens = prompt, np.maximum(mask.cumsum(-1) - 1, 0), 0, []
    for _ in range(new_tokens):
        feed = {"input_ids": ids, "attention_mask": mask, **past}
        if "position_ids" in inputs:
            feed["position_ids"] = positions
        logits, *present = session.run(outputs, feed)
        next_tokens = logits[:, -1].argmax(-1)
        tokens.append(next_tokens)
        past = {n: value for n, value in zip(pasts, present)}
        longest_past = max(longest_past, max(value.shape[2] for value in present))
        ids, positions = next_tokens[:, None], positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((batch, 1), mask.dtype)], axis=1)
    return np.stack(tokens, axis=1), longest_past
