"""Dims whose guards torch.export's solver cannot prove: exported as Dim.DYNAMIC, the guards checked over the range.

wav2vec2's attention guards ``max(1, samples // 10 - 1) ** 2 > 1``, true for every sample count
from 30, but the solver asks for ``samples = 10*_samples``, a divisibility no audio meets.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.builder.spine import build
from aot.errors import TraceError
from aot.tracing import export_trace
from aot.tracing.dim_narrowing import unproven_dim
from aot.tracing.export_guards import UNBOUNDED_CHECK_LIMIT, check_guards_over_ranges
from tests.tracing.tracing_zoo import assert_built_and_validated

DERIVED_REFUSAL = """Constraints violated (sequence)!
  - Not all values of sequence = L['input_values'].size()[1] in the specified range 30 <= sequence <= 10000 satisfy the generated guard ((-1) + (L['input_values'].size()[1] // 10))*((-1) + (L['input_values'].size()[1] // 10)) > 1.
Suggested fixes:
  _sequence = Dim('_sequence', min=3, max=1000)
  sequence = 10*_sequence
"""
EXAMPLE = {"input_values": torch.zeros(2, 170)}
DIMS = {"input_values": {0: "batch", 1: "sequence"}}


def _audio_model(cls):
    """A tiny wav2vec2-style model (wav2vec2, HuBERT): two feature convolutions, strides 5 and 2."""
    config = cls.config_class(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, conv_dim=(16, 16),
                              conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2, num_conv_pos_embeddings=16,
                              num_conv_pos_embedding_groups=2, vocab_size=20)
    torch.manual_seed(0)
    return cls(config).eval()


def test_a_derived_dim_suggestion_names_the_dim_and_a_plain_range_does_not():
    assert unproven_dim(DERIVED_REFUSAL, {"batch": [1, None], "sequence": [30, 10000]}) == "sequence"
    assert unproven_dim(DERIVED_REFUSAL, {"batch": [1, None]}) is None, "not one of the dims being exported"
    plain = "Suggested fixes:\n  sequence = Dim('sequence', min=7, max=64)\n"
    assert unproven_dim(plain, {"sequence": [2, 64]}) is None


def test_guards_that_hold_over_the_ranges_pass_and_a_range_without_maximum_is_noted():
    guards = [
        "max(1, (-1) + (L['input_values'].size()[1] // 10))*max(1, (-1) + (L['input_values'].size()[1] // 10)) > 1",
        "(L['input_values'].size()[0] % (L['input_values'].size()[0]*((-1) + (L['input_values'].size()[1] // 10)))) != 0",
    ]
    assert check_guards_over_ranges(guards, EXAMPLE, DIMS, {"batch": [1, 8], "sequence": [30, 4000]}) is None
    note = check_guards_over_ranges(guards, EXAMPLE, DIMS, {"batch": [1, 8], "sequence": [30, None]})
    assert note is not None and f"'sequence' up to {UNBOUNDED_CHECK_LIMIT}" in note


def test_a_guard_that_fails_inside_the_range_names_the_size():
    guards = ["L['input_values'].size()[1] != 35"]
    with pytest.raises(TraceError, match=r"guard `L\['input_values'\].size\(\)\[1\] != 35` fails at input_values.shape\[1\] = 35"):
        check_guards_over_ranges(guards, EXAMPLE, DIMS, {"batch": [1, 8], "sequence": [30, 400]})
    assert check_guards_over_ranges(guards, EXAMPLE, DIMS, {"batch": [1, 8], "sequence": [36, 400]}) is None


def test_a_guard_with_anything_but_size_arithmetic_is_refused():
    with pytest.raises(TraceError, match="cannot check torch.export's guard"):
        check_guards_over_ranges(["__import__('os').getpid() > 0"], EXAMPLE, DIMS, {"batch": [1, 8], "sequence": [30, 400]})


@pytest.mark.artifact
@pytest.mark.parametrize("cls", [transformers.Wav2Vec2Model, transformers.Wav2Vec2ForCTC, transformers.HubertModel])
def test_audio_exports_with_default_ranges_and_matches_eager_at_sample_counts_off_the_stride(cls):
    model = _audio_model(cls)
    try:  # torch.export's own refusal of these ranges (up to torch 2.13; 2.15 proves them itself)
        with torch.no_grad():
            torch.export.export(model, (), {"input_values": torch.randn(2, 170)}, strict=False,
                                dynamic_shapes={"input_values": {0: torch.export.Dim("b", min=1), 1: torch.export.Dim("s", min=30)}})
        refused = False
    except Exception as error:
        assert "Constraints violated" in str(error), error
        refused = True

    graph_module = export_trace(model, {"input_values": torch.randn(2, 170)}, DIMS)

    notes = graph_module.meta["trace_report"]["notes"]
    if refused:  # then aot exported with Dim.DYNAMIC and proved torch's guards over the ranges itself
        assert any("exported as Dim.DYNAMIC" in note for note in notes), notes
        assert any("checked at every size" in note for note in notes), notes
    for batch, samples in ((1, 171), (3, 333), (2, 1000)):
        inputs = {"input_values": torch.randn(batch, samples)}
        with torch.no_grad():
            expected = model(**inputs)
            torch.testing.assert_close(graph_module(**inputs)[next(iter(expected.keys()))], expected[0])


@pytest.mark.artifact
def test_a_wav2vec2_recipe_builds_on_the_export_frontend(tmp_path):
    recipe = tmp_path / "wav2vec2.yaml"
    recipe.write_text("""\
description: tiny wav2vec2 on the export frontend
model:
  config: {model_type: wav2vec2, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 48,
           conv_dim: [16, 16], conv_stride: [5, 2], conv_kernel: [10, 3], num_feat_extract_layers: 2,
           num_conv_pos_embeddings: 16, num_conv_pos_embedding_groups: 2}
  class: Wav2Vec2Model
  seed: 0
inputs:
  dims:
    batch: {size: 2, dynamic: true, min: 1, max: 4}
    sequence: {size: 170, dynamic: true, min: 30, max: 400}
  tensors:
    - {name: input_values, shape: [batch, sequence], dtype: float32}
trace: {frontend: export}
validate:
  shapes: [{batch: 1, sequence: 123}, {batch: 3, sequence: 391}]
""")

    report = build(str(recipe), tmp_path / "out")

    assert_built_and_validated(report)
