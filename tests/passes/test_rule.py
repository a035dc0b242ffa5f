"""The rule base: one result type for a miss, its reason in the notes, and the counts it keeps."""

from __future__ import annotations

import inspect
import operator
import sys

import pytest
import torch
from torch import nn

from aot.passes import FuseBatchNorm2dInConv2d, MergeLinears, registry
from aot.passes._nodes import replace_with
from aot.passes.rule import Match, RewriteRule
from tests.passes.helpers import (
    FRONTENDS,
    ConvOutputUsedTwice,
    SingleLinear,
    assert_matches_eager,
    count_calls,
    fx_graph,
    graph,
    randn_sets,
)

# Passes that match no pattern, so have no miss to explain: they copy, recompile, or drop what nothing reads.
NOT_RULES = {"deep_copy", "lint_and_recompile", "dead_code_elimination"}


class RemoveMulByOne(RewriteRule):
    """A toy rule: ``x * 1`` becomes ``x``; any other multiplication is a failed check."""

    def pattern(self, graph_module, node):
        return node.op == "call_function" and node.target is operator.mul

    def check(self, graph_module, node):
        if node.args[1] != 1:
            return Match.fail(f"multiplies by {node.args[1]}", node=node)
        return Match.ok(node)

    def rewrite(self, graph_module, node):
        replace_with(node, node.args[0])


class MulByOneThenThree(nn.Module):
    def forward(self, x):
        return (x * 1) * 3.0


def test_a_match_carries_its_value_or_its_reason():
    node = fx_graph(MulByOneThenThree(), torch.randn(2)).graph.find_nodes(op="call_function", target=operator.mul)[0]

    found, missed = Match.ok(node, sites=2), Match.fail("in training mode", node=node)

    assert found and found.value is node and found.sites == 2 and not found.reason
    assert not missed and missed.reason == f"node '{node.name}': in training mode"
    with pytest.raises(ValueError, match="a failed match has no value"):
        missed.value
    with pytest.raises(ValueError, match="needs a reason"):
        Match.fail("")


def test_failed_checks_are_counted_and_their_reasons_noted():
    model = MulByOneThenThree()
    graph_module = fx_graph(model, torch.randn(2))

    result = RemoveMulByOne().apply(graph_module)

    assert result.modified and (result.matched, result.changed) == (2, 1)
    assert result.notes == ["node 'mul_1': multiplies by 3.0"]
    assert_matches_eager(model, graph_module, randn_sets((2,), (3, 4), (1,)), atol=0, rtol=0)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_merge_linears_says_why_a_single_linear_is_not_merged(frontend):
    torch.manual_seed(0)
    model = SingleLinear().eval()
    graph_module = graph(frontend, model, torch.randn(2, 4))
    assert count_calls(graph_module, "Linear", torch.ops.aten.linear.default) == 1

    result = MergeLinears().apply(graph_module)

    assert not result.modified and (result.matched, result.changed) == (0, 0), "a near miss is not counted"
    assert len(result.notes) == 1 and "'fc' is the only linear layer reading it" in result.notes[0], result.notes


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_fuse_batch_norm_says_why_a_conv_read_twice_is_not_fused(frontend):
    torch.manual_seed(0)
    model = ConvOutputUsedTwice().eval()
    graph_module = graph(frontend, model, torch.randn(2, 3, 8, 8))

    result = FuseBatchNorm2dInConv2d().apply(graph_module)

    assert not result.modified and (result.matched, result.changed) == (1, 0), "a failed check is counted"
    assert len(result.notes) == 1 and "output is also read by" in result.notes[0], result.notes


@pytest.mark.parametrize("info", registry.all_passes(), ids=lambda info: info.name)
def test_every_pass_that_matches_patterns_is_a_rewrite_rule(info):
    assert issubclass(info.cls, RewriteRule) == (info.name not in NOT_RULES)


@pytest.mark.parametrize("info", registry.all_passes(), ids=lambda info: info.name)
def test_no_pass_notes_a_miss_by_itself(info):
    """A miss is a ``Match.fail``; the rule base alone turns it into a note."""
    source = inspect.getsource(sys.modules[info.cls.__module__])
    assert "self.note(" not in source
