"""Proxies that carry the value the traced program would have had.

A plain ``torch.fx.Proxy`` knows nothing about its value, so ``len(x)``,
``if x.shape[1] > 1`` or ``x.dim()`` stop the trace. A ``FakeProxy`` is backed
by the *fake value* of its node (a ``FakeTensor`` for tensors, a plain ``int``,
``torch.Size``, ``dtype``... otherwise), computed by the tracer as each node is
created. Operations still go into the graph; only Python-level conversions
(``bool``, ``len``, ``int``, ``float``, ``index``, iteration) resolve
concretely, and the tracer records each one as a *decision* in the trace report.

A conversion of a value that depends on tensor *data* (``bool(mask.any())``,
``int(t.sum())``, or a size of ``x.nonzero()``) cannot be resolved: it raises a
one-line ``TraceError`` naming the user's source line.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx

# Tensor attributes that are fixed by the ranks of the inputs; resolving them
# concretely is not a specialisation, and keeping them out of the graph keeps it small.
STATIC_TENSOR_ATTRIBUTES = frozenset({"ndim"})
STATIC_TENSOR_METHODS = frozenset({"dim", "ndimension"})


class FakeProxy(torch.fx.Proxy):
    def __repr__(self) -> str:
        return f"FakeProxy({self.node.name})"

    def __getattr__(self, name: str) -> Any:
        if name in STATIC_TENSOR_ATTRIBUTES:
            static = self.tracer.static_attribute(self, name)
            if static is not None:
                return static
        return FakeAttribute(self, name)

    def __bool__(self) -> bool:
        return self.tracer.concretize(self, "bool")

    def __len__(self) -> int:
        return self.tracer.concretize(self, "len")

    def __index__(self) -> int:
        return self.tracer.concretize(self, "index")

    def __int__(self) -> int:
        return self.tracer.concretize(self, "int")

    def __float__(self) -> float:
        return self.tracer.concretize(self, "float")

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})

    def __contains__(self, item: Any) -> bool:
        return self.tracer.concretize(self, "contains", item)


class FakeAttribute(FakeProxy):
    """``proxy.attr``: a ``getattr`` node made lazily, or a ``call_method`` node when called."""

    def __init__(self, root: FakeProxy, attr: str):
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node = None

    @property
    def node(self):
        if self._node is None:
            self._node = self.tracer.create_proxy("call_function", getattr, (self.root, self.attr), {}).node
        return self._node

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.attr in STATIC_TENSOR_METHODS and not args and not kwargs:
            static = self.tracer.static_attribute(self.root, "ndim")
            if static is not None:
                return static
        return self.tracer.create_proxy("call_method", self.attr, (self.root,) + args, kwargs)
