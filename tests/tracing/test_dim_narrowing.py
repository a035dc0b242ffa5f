"""Default dynamic ranges move past a size the model's code excludes; ranges the caller gave never do."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.errors import TraceError
from aot.tracing import export_trace
from aot.tracing.dim_narrowing import narrowed_default_range, suggested_ranges
from aot.gates.compare import eager_outputs
from aot.tracing.outputs import flatten_outputs
from tests.tracing.tracing_zoo import EXPORT_DIMS, unpadded_token_inputs

MOBILEBERT_REFUSAL = (
    "Constraints violated (seq)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
    "  - Not all values of seq = L['input_ids'].size()[1] in the specified range seq <= 64 satisfy the generated guard "
    "((-1) + L['input_ids'].size()[1]) != 1.\n"
)


def test_the_excluded_size_is_solved_from_the_guard():
    ranges = {"batch": [1, None], "seq": [2, 64]}
    name, low, high, note = narrowed_default_range(MOBILEBERT_REFUSAL, ranges, {})
    assert (name, low, high) == ("seq", 3, 64) and "excludes seq = 2" in note
    at_the_top = MOBILEBERT_REFUSAL.replace("((-1) + L['input_ids'].size()[1]) != 1", "L['input_ids'].size()[1] != 64")
    assert narrowed_default_range(at_the_top, ranges, {})[:3] == ("seq", 2, 63)
    inside = MOBILEBERT_REFUSAL.replace("!= 1.", "!= 9.")
    assert narrowed_default_range(inside, ranges, {}) is None, "a hole inside the range is not an end to move"
    assert narrowed_default_range(MOBILEBERT_REFUSAL, ranges, {"seq": (2, 64)}) is None, "a range the caller gave stays"
    compound = MOBILEBERT_REFUSAL.replace("((-1) + L['input_ids'].size()[1]) != 1", "L['input_ids'].size()[1] != 5 and L['input_ids'].size()[1] != 2")
    assert narrowed_default_range(compound, ranges, {}) is None, "only one inequality of one size is solved"
    assert narrowed_default_range(MOBILEBERT_REFUSAL, {"batch": [1, None], "seq": [2, 2]}, {}) is None, "no empty range"


def _mobilebert():
    torch.manual_seed(0)
    config = transformers.MobileBertConfig(vocab_size=99, hidden_size=32, embedding_size=16, intermediate_size=37, num_hidden_layers=2,
                                           num_attention_heads=4, intra_bottleneck_size=16, max_position_embeddings=64)
    return transformers.MobileBertModel(config).eval()


def _gpt_neo():
    torch.manual_seed(0)
    config = transformers.GPTNeoConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, window_size=8,
                                       attention_types=[[["global", "local"], 1]], max_position_embeddings=64)
    return transformers.GPTNeoModel(config).eval()


@pytest.mark.artifact
@pytest.mark.parametrize(("make", "seq_range"), [(_mobilebert, [3, 64]), (_gpt_neo, [2, 63])], ids=["mobilebert", "gpt_neo"])
def test_models_excluding_an_end_of_the_default_range_export_and_match_eager(make, seq_range):
    model = make()
    graph_module = export_trace(model, unpadded_token_inputs(2, 16), dynamic_dims=EXPORT_DIMS)
    report = graph_module.meta["trace_report"]
    assert report["dim_ranges"]["seq"] == seq_range
    assert any(note.startswith("dynamic dim 'seq'") for note in report["notes"]), report["notes"]
    for batch, sequence in ((1, 5), (2, 16), (3, 23)):
        inputs = unpadded_token_inputs(batch, sequence)
        expected = eager_outputs(model, inputs)  # with use_cache=False where the forward takes it, as traced
        with torch.no_grad():
            got = flatten_outputs(graph_module(**inputs))
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5)


def test_a_range_the_caller_gave_is_not_narrowed():
    with pytest.raises(TraceError, match=r"Constraints violated \(seq\)"):
        export_trace(_mobilebert(), unpadded_token_inputs(2, 16), dynamic_dims=EXPORT_DIMS, dim_ranges={"seq": (2, 64)})


MISTRAL_QA_REFUSAL = (
    "Constraints violated (seq)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
    "  - Not all values of seq = L['input_ids'].size()[1] in the specified range seq <= 64 satisfy the generated guard "
    "(8*L['input_ids'].size()[1]) != 48.\n"
    "  - Not all values of seq = L['input_ids'].size()[1] in the specified range seq <= 64 satisfy the generated guard "
    "6 <= L['input_ids'].size()[1] and L['input_ids'].size()[1] <= 64\n"
    "Suggested fixes:\n"
    "  seq = Dim('seq', min=6, max=64)\n"
)


def test_a_range_torch_export_suggests_inside_a_default_one_is_taken_and_named():
    ranges = {"batch": [1, None], "seq": [2, 64]}
    name, low, high, note = narrowed_default_range(MISTRAL_QA_REFUSAL, ranges, {})
    assert (name, low, high) == ("seq", 6, 64) and "as torch.export suggests" in note
    assert narrowed_default_range(MISTRAL_QA_REFUSAL, ranges, {"seq": (2, 64)}) is None, "a range the caller gave stays"
    wider = MISTRAL_QA_REFUSAL.replace("max=64)", "max=128)")
    assert narrowed_default_range(wider, ranges, {}) is None, "a suggestion outside the default range is not taken"
    derived = "Suggested fixes:\n  _seq = Dim('_seq', min=3, max=oo)\n  seq = 10*_seq\n"
    assert narrowed_default_range(derived, {"seq": [2, None]}, {}) is None, "a derived dim is no range"


@pytest.mark.artifact
def test_a_sliding_window_head_exports_on_the_range_its_code_holds_and_says_so():
    config = transformers.MistralConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=7, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.MistralForQuestionAnswering(config).eval()

    graph_module = export_trace(model, unpadded_token_inputs(2, 16), EXPORT_DIMS)

    report = graph_module.meta["trace_report"]
    assert report["dim_ranges"]["seq"] == [7, 64]
    assert any("as torch.export suggests" in note for note in report["notes"]), report["notes"]
    for batch, sequence in [(1, 7), (3, 23), (2, 64)]:
        inputs = unpadded_token_inputs(batch, sequence)
        expected = eager_outputs(model, inputs)
        with torch.no_grad():
            actual = flatten_outputs(graph_module(**inputs))
        for key, value in expected.items():
            torch.testing.assert_close(actual[key], value, atol=1e-5, rtol=1e-5)


def test_a_refused_given_range_names_the_range_torch_export_suggests():
    assert suggested_ranges(MISTRAL_QA_REFUSAL) == "seq: min 6, max 64"
    assert suggested_ranges("Constraints violated (seq)!") == ""
    config = transformers.MistralConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=7, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.MistralForQuestionAnswering(config).eval()

    with pytest.raises(TraceError, match=r"Constraints violated \(seq\)!.* \(the model's code holds on seq: min \d+, max 64, as torch.export suggests"):
        export_trace(model, unpadded_token_inputs(2, 16), EXPORT_DIMS, {"batch": (1, 8), "seq": (2, 64)})
