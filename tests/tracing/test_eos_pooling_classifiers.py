"""Encoder-decoder sequence classifiers (BART, mBART, PLBART, T5, MT5) on the fx frontend.

They classify the decoder state at each row's last EOS token::

    torch_compilable_check(torch.unique_consecutive(eos_mask.sum(1)).numel() == 1, "All examples must ...")
    hidden_states[eos_mask, :].view(batch, -1, hidden)[:, -1, :]

``unique_consecutive`` and boolean indexing have sizes that depend on the data: the tracer
carries them as unbacked size symbols, as torch.export does, and the check stays in the
graph as a ``check_condition`` node, so the GraphModule refuses what eager refuses.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import transformers as tf

from aot.builder.spine import build
from aot.tracing import symbolic_trace
from aot.tracing.dummy_inputs import default_input_names, make_dummy_inputs
from aot.tracing.torch_functions import check_condition
from tests.tracing.tracing_zoo import assert_built_and_validated

SHAPES = [(2, 5), (3, 7), (2, 16)]
_SEQ2SEQ = dict(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, num_labels=3)
_T5 = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_decoder_layers=1, num_heads=4, num_labels=3,
           decoder_start_token_id=0)
CLASSIFIERS = {
    "bart": (tf.BartForSequenceClassification, tf.BartConfig(**_SEQ2SEQ)),
    "mbart": (tf.MBartForSequenceClassification, tf.MBartConfig(**_SEQ2SEQ)),
    "t5": (tf.T5ForSequenceClassification, tf.T5Config(**_T5)),
}


def _model(name):
    cls, config = CLASSIFIERS[name]
    torch.manual_seed(0)
    return cls(config).eval()


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_fx_traces_the_eos_pooling_with_its_check_and_matches_eager_at_three_shapes(name):
    model = _model(name)
    names = default_input_names(model)

    graph_module = symbolic_trace(model)

    checks = [node for node in graph_module.graph.nodes if node.target is check_condition]
    assert [node.args[1] for node in checks] == [
        "All examples must have the same number of <eos> tokens.",
        "Each example must contain at least one <eos> token.",
    ]
    assert any(node.target is torch.functional.unique_consecutive for node in graph_module.graph.nodes)
    for batch, sequence in SHAPES:
        inputs = make_dummy_inputs(model, names, batch=batch, sequence=sequence)
        with torch.no_grad():
            torch.testing.assert_close(graph_module(**inputs)["logits"], model(**inputs).logits)


def test_the_graph_refuses_rows_with_other_eos_counts_as_eager_does():
    model = _model("bart")
    graph_module = symbolic_trace(model)
    inputs = make_dummy_inputs(model, default_input_names(model), batch=2, sequence=8)
    inputs["input_ids"][0, 3] = model.config.eos_token_id
    message = "All examples must have the same number of <eos> tokens."
    with pytest.raises(ValueError, match=message), torch.no_grad():
        model(**inputs)
    with pytest.raises(ValueError, match=message), torch.no_grad():
        graph_module(**inputs)


@pytest.mark.artifact
def test_a_recipe_ends_each_row_with_eos_and_the_classifier_builds_on_fx(tmp_path):
    recipe = tmp_path / "bart_classifier.yaml"
    recipe.write_text(textwrap.dedent("""\
        description: tiny BART classifier, pooled at each row's EOS
        model:
          config: {model_type: bart, vocab_size: 99, d_model: 32, encoder_layers: 1, decoder_layers: 1, encoder_attention_heads: 4,
                   decoder_attention_heads: 4, encoder_ffn_dim: 37, decoder_ffn_dim: 37, max_position_embeddings: 64, num_labels: 3}
          class: BartForSequenceClassification
          seed: 0
        inputs:
          dims:
            batch: {size: 2, dynamic: true, min: 1, max: 8}
            sequence: {size: 16, dynamic: true, min: 2, max: 32}
          tensors:
            - {name: input_ids, shape: [batch, sequence], dtype: int64, low: 3, last: 2}
            - {name: attention_mask, shape: [batch, sequence], dtype: int64}
        validate:
          shapes: [{batch: 1, sequence: 5}, {batch: 3, sequence: 11}]
        """))

    report = build(str(recipe), tmp_path / "out")

    assert_built_and_validated(report)
    module_source = (tmp_path / "out" / "graph_module" / "module.py").read_text()
    assert "def check_condition(" in module_source and "import aot" not in module_source
