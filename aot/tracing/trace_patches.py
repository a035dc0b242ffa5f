"""What the tracer swaps in the outside world while it runs, always put back.

- torch tensor constructors (``torch.arange(seq_len)`` with a traced length,
  ``torch.zeros(..., dtype=x.dtype)``), ``torch.finfo`` / ``torch.iinfo`` of
  a traced dtype and ``torch.sym_min`` / ``sym_max`` of traced sizes (a sliding-window
  cache keeps ``min(seen, window - 1)`` tokens) become graph nodes instead of baking the
  example's value;
- the mask builders of ``transformers.masking_utils``, wherever a loaded
  transformers module imported them, become the stand-ins of ``hf_masks``;
- ``torch_compilable_check`` of a traced condition becomes a ``check_condition``
  node (``torch_functions``), so the check stays in the graph.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx

from .hf_masks import MASK_BUILDER_KINDS, traced_mask_builder
from .source_location import user_location
from .torch_functions import check_condition

PROXY_AWARE_TORCH_FUNCTIONS = (
    "arange", "zeros", "ones", "full", "empty", "eye", "linspace", "tensor", "as_tensor",
    "rand", "randn", "randint", "finfo", "iinfo", "sym_min", "sym_max",
)


def _find_proxy(value: Any) -> torch.fx.Proxy | None:
    if isinstance(value, torch.fx.Proxy):
        return value
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    elif isinstance(value, slice):
        items = (value.start, value.stop, value.step)
    else:
        return None
    for item in items:
        found = _find_proxy(item)
        if found is not None:
            return found
    return None


def proxy_aware(function: Callable) -> Callable:
    """``function`` as is, unless an argument is traced: then a ``call_function`` node of it."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        proxy = _find_proxy(args)
        if proxy is None:
            proxy = _find_proxy(kwargs)
        if proxy is None:
            return function(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", function, args, kwargs)

    wrapper.__wrapped_by_aot_tracer__ = function
    return wrapper


def traced_check(original: Callable) -> Callable:
    """transformers' ``torch_compilable_check``, which on a traced condition records a ``check_condition`` node.

    A message that is a callable (it may format tensor values) becomes the place of the check.
    """

    @functools.wraps(original)
    def check(cond: Any, msg: Any, error_type: type[Exception] = ValueError) -> None:
        if not isinstance(cond, torch.fx.Proxy):
            return original(cond, msg, error_type)
        if not isinstance(msg, str):
            location = user_location()
            msg = f"the check at {location.short_file()}:{location.line} failed"
        cond.tracer.create_proxy("call_function", check_condition, (cond, msg), {})

    return check


def _patch_transformers_globals(patch: Callable[[dict, str, Any], None], replacements: dict[int, Callable]) -> None:
    """Bind each replacement wherever a loaded transformers module bound its original (keyed by id), under any name."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("transformers"):
            continue
        namespace = module.__dict__
        for name, value in list(namespace.items()):
            replacement = replacements.get(id(value))
            if replacement is not None:
                patch(namespace, name, replacement)


@contextlib.contextmanager
def tracing_patches(tracer) -> Iterator[None]:
    saved: list[tuple[dict, str, Any]] = []

    def patch(namespace: dict, name: str, value: Any) -> None:
        saved.append((namespace, name, namespace[name]))
        namespace[name] = value

    try:
        for name in PROXY_AWARE_TORCH_FUNCTIONS:
            patch(torch.__dict__, name, proxy_aware(torch.__dict__[name]))
        replacements: dict[int, Callable] = {}
        masking_utils = sys.modules.get("transformers.masking_utils")
        if masking_utils is not None:
            for name, kind in MASK_BUILDER_KINDS.items():
                if name in masking_utils.__dict__:
                    original = masking_utils.__dict__[name]
                    replacements[id(original)] = traced_mask_builder(original, kind)
        import_utils = sys.modules.get("transformers.utils.import_utils")
        if import_utils is not None and "torch_compilable_check" in import_utils.__dict__:
            original = import_utils.__dict__["torch_compilable_check"]
            replacements[id(original)] = traced_check(original)
        _patch_transformers_globals(patch, replacements)
        yield
    finally:
        for namespace, name, value in reversed(saved):
            namespace[name] = value
