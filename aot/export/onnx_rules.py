"""aot's own ONNX rewrite rules, registered by name and applied with onnxscript's rewriter.

Each rule is an onnxscript ``RewriteRuleClassBase`` in a module of its own: ``pattern``
(the ops it matches), ``check`` (a ``MatchResult`` that says why it refuses a match),
``rewrite`` (what replaces the match). The registry below gives each its name, the
ONNX Runtime targets it is made for, and the order they run in: each rule sees the
graph the one before it left. :func:`aot.export.ort_fusions.fuse_for_ort` runs them
after onnxscript's own fusions, whose ops (BiasGelu) they match, and puts how many
times each fired beside those fusions' counts (the manifest's ``onnx_fusions``).

"Why didn't it fire?": :func:`miss_reasons`, which the fusions log at DEBUG for a
rule that fired nowhere.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRule, RewriteRuleClassBase

from .split_feed_forward import SplitFeedForward
from .sum_into_layer_norm import SumIntoLayerNorm

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxRule:
    name: str
    rule_class: type[RewriteRuleClassBase]
    targets: frozenset[str]  # the ONNX Runtime targets ("cpu", "cuda") where the rewrite is the faster form

    def rewrite_rule(self) -> RewriteRule:
        """A fresh onnxscript rule: the rule classes keep state for one model (block numbers, the nodes they made)."""
        return self.rule_class.rule(self.name)


def _registry(*rules: OnnxRule) -> Mapping[str, OnnxRule]:
    by_name: dict[str, OnnxRule] = {}
    for rule in rules:
        if rule.name in by_name:
            raise ValueError(f"two ONNX rules are registered as {rule.name!r}")
        by_name[rule.name] = rule
    return types.MappingProxyType(by_name)


ONNX_RULES = _registry(
    OnnxRule("split_feed_forward", SplitFeedForward, frozenset({"cpu"})),
    OnnxRule("sum_into_layer_norm", SumIntoLayerNorm, frozenset({"cpu"})),
)


def apply_onnx_rules(model: ir.Model, target: str) -> dict[str, int]:
    """Rewrite ``model`` in place with the rules made for ``target``, in order; return ``{name: times fired}``."""
    counts = {}
    for rule in ONNX_RULES.values():
        if target not in rule.targets:
            continue
        counts[rule.name] = rule.rewrite_rule().apply_to_model(model)
        if not counts[rule.name] and logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s fired nowhere: %s", rule.name, "; ".join(miss_reasons(model, rule.name)) or "no match")
    return counts


def miss_reasons(model: ir.Model, name: str) -> list[str]:
    """Why rule ``name`` refuses the matches in ``model`` that came closest to firing (none where it fires).

    onnxscript's ``MatchingTracer`` keeps, per rule, the closest matches: past the pattern and
    refused by ``check`` before those the pattern or the rewriter's removability test refused.
    Only matching runs here: the rewriter's own tracing mode would run ``rewrite`` too, and
    a rewrite may touch the graph before the rewriter puts its result in.
    """
    rule = ONNX_RULES[name].rewrite_rule()
    tracer = MatchingTracer()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        rule.match(model, node.graph, node, tracer=tracer)
    return [match.match_result.reason for match in tracer.best_matches_map[rule] if match.status != MatchStatus.SUCCESS]
