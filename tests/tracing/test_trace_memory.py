"""The traced graph does not keep the eager model's weights alive once the model is gone."""

from __future__ import annotations

import pytest
import gc
import weakref

import torch

from aot.tracing import symbolic_trace
from tests.export import models


@pytest.mark.artifact
def test_dropping_the_eager_model_frees_its_parameters():
    model = models.tiny_bert()
    weight = weakref.ref(model.encoder.layer[0].attention.self.query.weight)
    assert torch.is_grad_enabled() and weight().requires_grad  # the case that used to leak
    gm = symbolic_trace(model, input_names=["input_ids", "attention_mask"])
    assert any(node.op == "call_module" for node in gm.graph.nodes)
    values = [node.meta["val"] for node in gm.graph.nodes if isinstance(node.meta.get("val"), torch.Tensor)]
    assert values, "the tracer records fake values"
    assert all(value.grad_fn is None for value in values)
    del model
    gc.collect()
    assert weight() is None, "node.meta kept an autograd path to the eager parameters"
    inputs = models.text_inputs(2, 7)
    assert gm(**inputs)["last_hidden_state"].shape == (2, 7, 32)  # the graph still owns its own weights
