"""LintAndRecompile: regenerates code, reports no modification, names itself when the graph is broken."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from aot.errors import PassError
from aot.passes import LintAndRecompile
from tests.passes.helpers import fx_graph


def test_recompiles_without_claiming_a_change():
    graph_module = fx_graph(nn.Sequential(nn.ReLU()), torch.randn(2))
    node = next(n for n in graph_module.graph.nodes if n.op == "call_module")
    with graph_module.graph.inserting_after(node):
        doubled = graph_module.graph.call_function(operator.mul, (node, 2.0))
    node.replace_all_uses_with(doubled)
    doubled.args = (node, 2.0)
    assert "mul" not in graph_module.code

    result = LintAndRecompile().apply(graph_module)

    assert not result.modified and "2.0" in graph_module.code
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 2.0))


def test_a_broken_graph_is_reported_as_a_pass_error():
    graph_module = fx_graph(nn.Sequential(nn.ReLU()), torch.randn(2))
    stranger = torch.fx.Graph().placeholder("stranger")  # a node of another graph
    node = next(n for n in graph_module.graph.nodes if n.op == "call_module")
    node.args = (stranger,)
    with pytest.raises(PassError, match="lint_and_recompile"):
        LintAndRecompile()(graph_module)
