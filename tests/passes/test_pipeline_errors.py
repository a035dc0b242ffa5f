"""A pass that fails in the pipeline: one line naming the pass, its step and the passes before it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.builder.pipeline import run_pipeline
from aot.errors import PassError
from aot.passes import DeadCodeElimination, MergeLinears, RemoveDropout
from aot.recipe.schema import PassSpec
from tests.passes.helpers import LinearPair, fx_graph

PIPELINE = [PassSpec(name="merge_linears"), PassSpec(name="remove_dropout"), PassSpec(name="dead_code_elimination")]


def _graph() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    return fx_graph(nn.Sequential(LinearPair(), nn.Dropout(0.1)).eval(), torch.randn(2, 4))


def _failure(monkeypatch, cls: type, method: str, replacement) -> PassError:
    """The error the pipeline raises once ``cls.method`` is replaced."""
    _, records = run_pipeline(_graph(), PIPELINE)
    assert [record.changed > 0 for record in records] == [True, True, False], "precondition: each pass has work, none fails"
    monkeypatch.setattr(cls, method, replacement)
    with pytest.raises(PassError) as caught:
        run_pipeline(_graph(), PIPELINE)
    assert caught.value.exit_code == 4 and "\n" not in str(caught.value)
    return caught.value


def _raise(error: Exception):
    def raising(self, *args):
        raise error

    return raising


def test_a_failing_pass_names_its_step_and_the_passes_before_it(monkeypatch):
    error = _failure(monkeypatch, DeadCodeElimination, "transform", _raise(RuntimeError("boom")))

    assert str(error) == "pass 'dead_code_elimination' (step 3, after passes [merge_linears, remove_dropout]) failed: RuntimeError: boom"
    assert isinstance(error.__cause__, RuntimeError), "the original error stays reachable (aot --debug)"


def test_the_first_pass_failing_says_it_was_the_first(monkeypatch):
    error = _failure(monkeypatch, MergeLinears, "rewrite", _raise(RuntimeError("boom")))

    assert str(error) == "pass 'merge_linears' (step 1, the first pass) failed: RuntimeError: boom"


def test_a_pass_error_the_pass_raises_itself_gets_the_step_too(monkeypatch):
    error = _failure(monkeypatch, RemoveDropout, "rewrite", _raise(PassError("node 'x' holds no reverse data")))

    assert str(error) == "pass 'remove_dropout' (step 2, after passes [merge_linears]) failed: node 'x' holds no reverse data"


def test_a_pass_leaving_an_invalid_graph_is_named_with_its_step(monkeypatch):
    def dangle(self, graph_module, dropout):
        node, _ = dropout
        node.args = (torch.fx.Node(graph_module.graph, "ghost", "placeholder", "ghost", (), {}),)

    error = _failure(monkeypatch, RemoveDropout, "rewrite", dangle)

    assert str(error).startswith("pass 'remove_dropout' (step 2, after passes [merge_linears]) failed: it left an invalid graph: ")
