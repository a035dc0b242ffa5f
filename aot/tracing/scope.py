"""Which module a graph node came from.

Every node the tracer creates gets ``node.meta["scope"] = Scope(module_path,
module_type)``: the qualified name of the innermost module whose ``forward``
was running (``""`` for the root) and that module's qualified class name as a
string, so the value is JSON-serialisable and survives pickling::

    encoder.layer.0.attention.self.query   call_module   Scope("encoder.layer.0.attention.self.query",
                                                               "torch.nn.modules.linear.Linear")
    view                                     call_method   Scope("encoder.layer.0.attention.self",
                                                               "transformers.models.bert.modeling_bert.BertSelfAttention")
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Scope(NamedTuple):
    module_path: str
    module_type: str


def qualified_type_name(module: torch.nn.Module | type) -> str:
    cls = module if isinstance(module, type) else type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


class ScopeContextManager:
    """Makes ``tracer.current_scope`` the scope of ``module`` while its forward runs.

    On exit the previous scope comes back, so nested module calls nest scopes.
    """

    def __init__(self, tracer, module: torch.nn.Module, module_path: str):
        self.tracer = tracer
        self.scope = Scope(module_path, qualified_type_name(module))
        self.previous: Scope | None = None

    def __enter__(self) -> Scope:
        self.previous = self.tracer.current_scope
        self.tracer.current_scope = self.scope
        return self.scope

    def __exit__(self, *exc) -> None:
        self.tracer.current_scope = self.previous
