"""A decoder's KV-cache step in the form aot's build traces, validates and saves: keyword tensors in, a dict out.

``FlatCacheDecoder`` takes its tensors positionally under the convention's names
(``past_key_values.0.key``), which are no Python identifiers. The build calls every model
as ``model(**inputs)`` and writes a GraphModule whose ``forward`` names its parameters, so
:class:`DecoderStep` takes the same tensors as keywords under Python names
(``past_key_values_0_key``, :func:`python_name`) and returns ``{"logits": ..., "present.0.key": ...}``.
The ONNX model's inputs are renamed back to the convention (:meth:`DecoderStep.onnx_input_names`).

It also says what a build needs from a step: the shape cases it is checked at, its dynamic
axes and their ranges, and what the saved ``module.py`` needs to generate
(:meth:`DecoderStep.artifact_meta`).
"""

from __future__ import annotations

import inspect

import torch

from .export_spec import dynamic_axes, example_inputs, trace_sizes
from .flat_cache import FlatCacheDecoder
from .names import BATCH, PAST_SEQUENCE, PAST_WINDOW_SEQUENCE, SEQUENCE, TOTAL_SEQUENCE

_CHECK_PREFILL = {"batch": 1, "sequence": 7, "seen": 0}  # a prompt with an empty past


def python_name(name: str) -> str:
    """``past_key_values.0.key`` -> ``past_key_values_0_key``: the keyword a GraphModule's forward can take."""
    return name.replace(".", "_")


class DecoderStep(torch.nn.Module):
    """``FlatCacheDecoder(model)`` called as ``step(**{python name: tensor})`` -> ``{output name: tensor}``."""

    def __init__(self, model: torch.nn.Module, last_logits_only: bool = False):
        super().__init__()
        self.decoder = FlatCacheDecoder(model, last_logits_only)
        self.input_names = [python_name(name) for name in self.decoder.input_names()]
        self.output_names = self.decoder.output_names()
        # torch.export and the build read forward's parameters by name; each layout has its own.
        parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ["self", *self.input_names]]
        forward = _forward_with(inspect.Signature(parameters))
        self.__class__ = type(f"{type(model).__name__}Step", (DecoderStep,), {"forward": forward})

    @property
    def causal_lm(self) -> torch.nn.Module:
        """The transformers model inside (eager ``generate`` is the reference)."""
        return self.decoder.model

    @property
    def config(self):
        return self.decoder.text_config

    def onnx_input_names(self) -> dict[str, str]:
        """``{python name: the convention's name}`` for every input."""
        return dict(zip(self.input_names, self.decoder.input_names()))

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """``{python input name: {axis: dim name}}``: batch, sequence, total_sequence and the pasts."""
        return {python_name(name): axes for name, axes in dynamic_axes(self.decoder).items()}

    def dim_ranges(self) -> dict[str, tuple[int | None, int | None] | str]:
        """Bounds that admit a prefill (an empty past) and a decode step (one token) up to the model's positions.

        The mask's length is ``past + sequence``, which no named dim can state: torch.export infers it.
        """
        from aot.tracing.export_trace import INFERRED, max_positions

        positions = max_positions(self)  # from self.config, as for any model
        windows = self.decoder.sliding_windows
        ranges = {BATCH: (1, None), SEQUENCE: (1, positions), TOTAL_SEQUENCE: INFERRED, PAST_SEQUENCE: (0, positions)}
        if windows:
            ranges[PAST_WINDOW_SEQUENCE] = (0, max(windows) - 1)
        return ranges

    def check_sizes(self) -> list[dict[str, int]]:
        """The step's shape cases: the trace's, a prefill, and a decode step whose past reaches past every window."""
        traced = trace_sizes(self.decoder)
        windows = self.decoder.sliding_windows
        decode = {"batch": 3, "sequence": 1, "seen": max(windows + [traced["seen"]]) + 3}
        return [traced, dict(_CHECK_PREFILL), decode]

    def case_inputs(self, sizes: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
        return dict(zip(self.input_names, example_inputs(self.decoder, seed=seed, **sizes)))

    def artifact_meta(self) -> dict:
        """What ``module.py``'s ``generate`` needs: the step's input names and its past's layout (JSON-ready)."""
        layout = self.decoder.past_layout
        return {
            "inputs": self.input_names,
            "outputs": self.output_names,
            "heads_and_dims": [list(pair) for pair in layout.heads_and_dims],
            "dtype": str(layout.dtype).removeprefix("torch."),
            "takes_position_ids": layout.takes_position_ids,
        }


def _forward_with(signature: inspect.Signature):
    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        outputs = self.decoder(*(inputs[name] for name in self.input_names))
        return dict(zip(self.output_names, outputs))

    forward.__signature__ = signature
    return forward
