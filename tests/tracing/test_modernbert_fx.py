"""ModernBERT on the fx frontend: its local-attention layers' bidirectional sliding-window mask is traced."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from aot.tracing import symbolic_trace
from aot.tracing.torch_functions import bidirectional_sliding_window_mask
from tests.tracing.tracing_zoo import VOCAB, _text_inputs, assert_matches_eager

_NAMES = ["input_ids", "attention_mask"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_modernbert_traces_its_sliding_window_layers_and_matches_eager_at_three_shapes(attn):
    config = tf.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                                 local_attention=4, global_attn_every_n_layers=3, max_position_embeddings=64,
                                 pad_token_id=0, attn_implementation=attn)
    torch.manual_seed(0)
    model = tf.ModernBertModel(config).eval()
    shapes = [lambda b=b, s=s: _text_inputs(_NAMES, b, s) for b, s in [(2, 16), (1, 5), (3, 23)]]
    assert config.sliding_window < 16, "precondition: the window is shorter than the sequences, so its band masks something"

    graph_module = symbolic_trace(model, _NAMES)

    windowed = [node for node in graph_module.graph.nodes if node.target is bidirectional_sliding_window_mask]
    assert len(windowed) == 1 and windowed[0].args[2] == config.sliding_window
    assert_matches_eager(model, graph_module, shapes, atol=1e-5)
