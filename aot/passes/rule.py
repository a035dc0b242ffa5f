"""Rewrite rules: find each site, check it, rewrite it, or say why it was left alone.

A pass that rewrites a pattern is a :class:`RewriteRule` in three steps, the split
of onnxscript's ``RewriteRuleClassBase``:

``candidates``
    The sites shaped like what the rule rewrites, each as a :class:`Match`. By
    default every node for which ``pattern(graph_module, node)`` is true, in
    graph order; a rule that rewrites groups (several layers on one input, every
    call site of one layer) yields one ``Match`` a group. A site whose pattern
    is incomplete (a lone linear layer where ``merge_linears`` needs two) is a
    near miss: ``Match.fail(reason)``.
``check``
    The conditions a found site must meet (inference mode, a known shape, no
    other reader): ``Match.ok(value)`` with what ``rewrite`` needs, or
    ``Match.fail(reason)``.
``rewrite``
    Edits the graph at a checked site. It does not fail: whatever can make a
    site unusable belongs in ``check``, before anything is changed.

``Match`` is the one way a rule says "no": every ``fail`` reason becomes a line of
``PassResult.notes``, which answers "why didn't my pass fire here?". ``matched``
counts the sites the pattern found (``Match.ok(..., sites=n)`` for a group that
stands for ``n`` call sites), ``changed`` those rewritten; near misses are noted
but not counted.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from torch.fx import GraphModule, Node

from .base import Transformation

T = TypeVar("T")


class Match(Generic[T]):
    """What a rule found at one site: ``Match.ok(value)``, or ``Match.fail(reason)``.

    True when it matched. ``value`` is what the rule bound there (a node, the
    tensors to fold, ...); asking a failed match for it is a bug and raises.
    """

    __slots__ = ("_value", "reason", "sites")

    def __init__(self, value: T | None, reason: str, sites: int) -> None:
        self._value = value
        self.reason = reason
        self.sites = sites

    @classmethod
    def ok(cls, value: T, *, sites: int = 1) -> Match[T]:
        """A site to rewrite; ``sites`` is how many call sites it stands for in the counts."""
        return cls(value, "", sites)

    @classmethod
    def fail(cls, reason: str, *, node: Node | None = None) -> Match[Any]:
        """A site left alone; ``node``, when given, is named in front of ``reason``."""
        if not reason:
            raise ValueError("a failed match needs a reason")
        return cls(None, f"node '{node.name}': {reason}" if node is not None else reason, 0)

    def __bool__(self) -> bool:
        return not self.reason

    @property
    def value(self) -> T:
        if self.reason:
            raise ValueError(f"a failed match has no value ({self.reason})")
        return self._value

    def __repr__(self) -> str:
        return f"Match.ok({self._value!r})" if not self.reason else f"Match.fail({self.reason!r})"


class RewriteRule(Transformation):
    """A pass made of ``candidates`` (or ``pattern``), ``check`` and ``rewrite``; see the module doc."""

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        """Whether ``node`` is the operation this rule rewrites (no reason: most nodes are not)."""
        raise NotImplementedError(f"{type(self).__name__} must define pattern() or candidates()")

    def candidates(self, graph_module: GraphModule) -> Iterator[Match]:
        """Every node ``pattern`` accepts, as ``Match.ok(node)``.

        A generator: each site is found after the previous one was rewritten, so
        nodes erased by an earlier rewrite are skipped.
        """
        for node in list(graph_module.graph.nodes):
            if not node._erased and self.pattern(graph_module, node):
                yield Match.ok(node)

    def check(self, graph_module: GraphModule, found: Any) -> Match:
        """Whether the site ``found`` (a candidate's value) can be rewritten; by default it can."""
        return Match.ok(found)

    @abstractmethod
    def rewrite(self, graph_module: GraphModule, matched: Any) -> None:
        """Rewrites the site ``check`` accepted; ``matched`` is its value."""

    def transform(self, graph_module: GraphModule) -> GraphModule:
        for candidate in self.candidates(graph_module):
            if not candidate:  # a near miss: noted, not counted
                self.note(candidate.reason)
                continue
            self.report.matched += candidate.sites
            checked = self.check(graph_module, candidate.value)
            if not checked:
                self.note(checked.reason)
                continue
            self.rewrite(graph_module, checked.value)
            self.report.changed += candidate.sites
        return graph_module
