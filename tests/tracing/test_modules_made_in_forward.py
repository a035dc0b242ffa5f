"""Modules a model creates inside forward: stateless ones join the graph (as HFTracer did), others are refused."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.errors import TraceError
from aot.tracing import symbolic_trace

SHAPES = [(1, 5), (2, 7), (3, 16)]


def _distilbert_classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=128, num_labels=3)
    return transformers.DistilBertForSequenceClassification(config).eval()


def _inputs(batch: int, sequence: int, labels: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    inputs = {
        "input_ids": torch.randint(0, 128, (batch, sequence), generator=generator),
        "attention_mask": torch.ones(batch, sequence, dtype=torch.int64),
    }
    if labels:
        inputs["labels"] = torch.randint(0, 3, (batch,), generator=generator)
    return inputs


def _inserted(graph_module) -> list[str]:
    return [str(n.target) for n in graph_module.graph.nodes if n.op == "call_module" and str(n.target).startswith("_inserted_")]


def test_a_relu_made_in_forward_is_called_as_a_submodule_and_matches_eager():
    model = _distilbert_classifier()
    graph_module = symbolic_trace(model, input_names=["input_ids", "attention_mask"])
    assert _inserted(graph_module) == ["_inserted_relu_0"]
    assert isinstance(graph_module.get_submodule("_inserted_relu_0"), torch.nn.ReLU)
    assert not hasattr(model, "_inserted_relu_0"), "the eager model is not changed"
    with torch.no_grad():
        for batch, sequence in SHAPES:
            inputs = _inputs(batch, sequence)
            torch.testing.assert_close(graph_module(**inputs)["logits"], model(**inputs).logits, atol=0, rtol=0)


def test_a_loss_made_in_forward_is_traced_with_its_labels():
    model = _distilbert_classifier()
    # Classification labels are (batch,): given, since the tracer's own dummy labels follow input_ids' shape.
    example = _inputs(2, 16, labels=True)
    graph_module = symbolic_trace(model, input_names=list(example), dummy_inputs=example)
    assert any(name.startswith("_inserted_crossentropyloss") for name in _inserted(graph_module)), _inserted(graph_module)
    with torch.no_grad():
        for batch, sequence in SHAPES:
            inputs = _inputs(batch, sequence, labels=True)
            got, want = graph_module(**inputs), model(**inputs)
            torch.testing.assert_close(got["loss"], want.loss)
            torch.testing.assert_close(got["logits"], want.logits)


class MakesALinearInForward(torch.nn.Module):
    def forward(self, x):
        return torch.nn.Linear(4, 4)(x)


def test_a_module_with_weights_made_in_forward_is_refused_with_its_line():
    with pytest.raises(TraceError, match=r"Linear is created inside forward with parameters or buffers, at .*test_modules_made_in_forward.py:\d+") as caught:
        symbolic_trace(MakesALinearInForward(), input_names=["x"], dummy_inputs={"x": torch.randn(2, 4)})
    assert "create it in __init__" in str(caught.value) and "\n" not in str(caught.value)


DISTILBERT_CLASSIFIER = """\
model:
  config: {model_type: distilbert, dim: 32, n_layers: 2, n_heads: 4, hidden_dim: 64, vocab_size: 128, num_labels: 3}
  class: DistilBertForSequenceClassification
inputs:
  dims:
    batch: {size: 2, dynamic: true}
    sequence: {size: 8, dynamic: true}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
    - {name: attention_mask, shape: [batch, sequence]}
"""


@pytest.mark.artifact
def test_a_classifier_with_a_relu_made_in_forward_builds_end_to_end(write_recipe, tmp_path):
    import json

    from tests.conftest import run_aot

    result = run_aot("build", write_recipe(DISTILBERT_CLASSIFIER), "-o", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {v["artifact"] for v in manifest["validation"] if v["ok"]} == {"graph", "graph_module", "onnx"}
    assert "_inserted_relu_0" in (tmp_path / "out" / "graph_module" / "module.py").read_text()
