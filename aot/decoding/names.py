"""Names of a flat decoder step's inputs, outputs and dynamic axes (Optimum's decoder-with-past convention).

Inputs, in order::

    input_ids                  (batch, sequence)            int64
    attention_mask             (batch, total_sequence)      int64, 0 on left padding
    position_ids               (batch, sequence)            int64, only where the model's forward takes it
    past_key_values.{i}.key    (batch, kv_heads, past, head_dim)    for every layer i
    past_key_values.{i}.value  (batch, kv_heads, past, head_dim)

Outputs, in order: ``logits`` (batch, sequence, vocab), then ``present.{i}.key`` and
``present.{i}.value`` per layer: the cache after the step, fed back as the next step's past.

``total_sequence`` counts every token the sequence has seen, this step's included. A
full-attention layer's past holds ``past_sequence = total_sequence - sequence`` tokens; a
sliding-window layer's past holds only the last ones its window needs
(``past_window_sequence``, at most ``window - 1``), which is why the two are named apart.

Standard library only: the ONNX Runtime adapter and exporters share these names.
"""

from __future__ import annotations

BATCH = "batch"
SEQUENCE = "sequence"
TOTAL_SEQUENCE = "total_sequence"
PAST_SEQUENCE = "past_sequence"
PAST_WINDOW_SEQUENCE = "past_window_sequence"


def past_names(num_layers: int) -> list[str]:
    """``past_key_values.{i}.key``, ``past_key_values.{i}.value`` for every layer, in order."""
    return [f"past_key_values.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    """``present.{i}.key``, ``present.{i}.value`` for every layer, in order."""
    return [f"present.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]


def input_names(num_layers: int, with_position_ids: bool) -> list[str]:
    """The step's inputs in the order it takes them."""
    leading = ["input_ids", "attention_mask"] + (["position_ids"] if with_position_ids else [])
    return leading + past_names(num_layers)


def output_names(num_layers: int) -> list[str]:
    """The step's outputs in the order it returns them."""
    return ["logits"] + present_names(num_layers)
