"""aot's ONNX rule registry: names, targets, order, a duplicate refused, and why a rule did not fire."""

from __future__ import annotations

import pytest

from aot.export import onnx_rules
from aot.export.onnx_rules import ONNX_RULES, OnnxRule, apply_onnx_rules
from tests.log_messages import messages_of

from .test_split_feed_forward import _feed_forward


def test_the_rules_are_registered_by_name_in_the_order_they_run():
    assert list(ONNX_RULES) == ["split_feed_forward", "sum_into_layer_norm"]
    assert all(rule.targets == {"cpu"} for rule in ONNX_RULES.values())
    assert all(rule.rewrite_rule().name == name for name, rule in ONNX_RULES.items())


def test_a_second_rule_of_the_same_name_is_an_error():
    rule = ONNX_RULES["split_feed_forward"]
    twin = OnnxRule(rule.name, ONNX_RULES["sum_into_layer_norm"].rule_class, frozenset({"cuda"}))
    with pytest.raises(ValueError, match="two ONNX rules are registered as 'split_feed_forward'"):
        onnx_rules._registry(rule, twin)


def test_only_the_targets_rules_run_and_each_is_counted():
    assert apply_onnx_rules(_feed_forward(16), "cuda") == {}
    # the block splits; its residual Add feeds no LayerNormalization
    assert apply_onnx_rules(_feed_forward(16), "cpu") == {"split_feed_forward": 1, "sum_into_layer_norm": 0}


def test_a_rule_that_fires_nowhere_says_why_at_debug_level():
    with messages_of(onnx_rules.__name__) as messages:
        apply_onnx_rules(_feed_forward(15), "cpu")
    assert "split_feed_forward fired nowhere: the hidden width 15 is odd: there are no two equal halves" in messages
    assert any(message.startswith("sum_into_layer_norm fired nowhere: ") for message in messages), messages
