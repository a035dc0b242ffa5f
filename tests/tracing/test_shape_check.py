"""No silent specialisation: symbolic_trace checks its graph at a second shape, and notes size-0/1 examples."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.errors import TraceError
from aot.tracing import symbolic_trace
from aot.tracing.shape_check import SECOND_SEQUENCE


def _tiny_bert_config() -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64)


class FirstHalfOfTokens(transformers.BertModel):
    """Keeps the first half of the tokens, the half computed from a size read as a Python int: baked in."""

    def forward(self, input_ids, attention_mask=None):
        hidden = super().forward(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        half = int(hidden.shape[1]) // 2
        return {"first_half": hidden[:, :half]}


def _eval(model_class):
    torch.manual_seed(0)
    return model_class(_tiny_bert_config()).eval()


def test_a_graph_that_specialised_on_the_dummy_shape_is_refused():
    model = _eval(FirstHalfOfTokens)
    unchecked = symbolic_trace(model, ["input_ids", "attention_mask"], disable_check=True)
    ids = torch.randint(0, 99, (3, SECOND_SEQUENCE))
    assert unchecked(input_ids=ids, attention_mask=torch.ones_like(ids))["first_half"].shape[1] == 8, (
        "precondition: the traced graph kept 8 of 11 tokens, where eager keeps 5: it is silently wrong"
    )

    with pytest.raises(TraceError, match=r"FirstHalfOfTokens gives 'first_half' the shape \[3, 8, 32\] at a second shape") as caught:
        symbolic_trace(model, ["input_ids", "attention_mask"])
    assert "disable_check=True" in str(caught.value) and "\n" not in str(caught.value)


def test_a_graph_that_holds_at_other_shapes_says_it_was_checked():
    graph_module = symbolic_trace(_eval(transformers.BertModel), ["input_ids", "attention_mask"])
    assert "checked against eager at a second shape (batch 3, sequence 11)" in graph_module.meta["trace_report"]["notes"]


def test_example_inputs_of_size_one_are_noted():
    model = _eval(transformers.BertModel)
    example = {"input_ids": torch.randint(0, 99, (1, 6)), "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    notes = symbolic_trace(model, list(example), dummy_inputs=example).meta["trace_report"]["notes"]
    assert [note for note in notes if note.startswith("input 'input_ids' axis 0 was traced at size 1")]
    assert len([note for note in notes if "size 1" in note]) == 2, notes
    wider = {name: tensor.expand(2, 6).clone() for name, tensor in example.items()}
    assert not any("size 1" in note for note in symbolic_trace(model, list(wider), dummy_inputs=wider).meta["trace_report"]["notes"])
