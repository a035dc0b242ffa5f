"""RemoveDropout: eval-mode and p = 0 dropout disappear; training-mode dropout stays."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.passes import RemoveDropout
from tests.passes.helpers import (
    BERT_SHAPES,
    FRONTENDS,
    assert_matches_eager,
    bert_inputs,
    count_calls,
    graph,
    hf_graph,
    randn_sets,
    tiny_bert,
)

aten = torch.ops.aten
SHAPES = [(2, 4), (3, 4), (5, 4)]
DROPOUTS = ("Dropout", nn.functional.dropout, aten.dropout.default)


class Dropouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = self.drop(self.fc(x))
        x = nn.functional.dropout(x, 0.2, training=self.training)
        return nn.functional.dropout(x, p=0.0) + 1


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_eval_mode_dropout_is_removed(frontend):
    torch.manual_seed(0)
    model = Dropouts().eval()
    graph_module = graph(frontend, model, torch.randn(*SHAPES[0]))
    before = count_calls(graph_module, *DROPOUTS)
    assert before >= 2

    result = RemoveDropout().apply(graph_module)

    assert result.modified and result.changed == before
    assert count_calls(graph_module, *DROPOUTS) == 0
    assert "drop" not in dict(graph_module.named_modules())
    assert_matches_eager(model, graph_module, randn_sets(*SHAPES), atol=0, rtol=0)


def test_training_mode_dropout_stays():
    torch.manual_seed(0)
    graph_module = graph("fx", Dropouts().train(), torch.randn(*SHAPES[0]))

    result = RemoveDropout().apply(graph_module)

    assert result.changed == 1  # only the p = 0 one
    assert count_calls(graph_module, *DROPOUTS) == 2 and all("training mode" in note for note in result.notes)


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
def test_bert(frontend):
    model = tiny_bert("eager")
    graph_module = hf_graph(frontend, model, bert_inputs(2, 7))
    assert count_calls(graph_module, *DROPOUTS) > 0

    result = RemoveDropout().apply(graph_module)

    assert result.changed == 7 and count_calls(graph_module, *DROPOUTS) == 0
    inputs = [bert_inputs(b, s, seed=i) for i, (b, s) in enumerate(BERT_SHAPES)]
    assert_matches_eager(model, graph_module, inputs, atol=1e-5, rtol=1e-4)
