"""The name under which a transformers model takes, and returns, its KV cache.

transformers 5.24 renamed the decoder forward's ``past_key_values`` to ``cache`` (the model
outputs' field and the mask builders' keyword too); the old keyword still works through
``**kwargs`` with a FutureWarning until 5.40. Releases before 5.24 know only
``past_key_values``. aot reads the name from the signature it is about to call, never from
the installed version, so a model class that was written against either spelling works.

The ONNX and GraphModule artifacts keep Optimum's tensor names (``past_key_values.{i}.key``,
``present.{i}.key``) whichever spelling the model uses: those are the artifact's contract,
not the library's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

# Newest first: a forward that takes both (a shim) is called with the current name.
CACHE_ARGUMENT_NAMES = ("cache", "past_key_values")


def cache_argument(function: Callable[..., Any]) -> str | None:
    """The keyword ``function`` takes its KV cache under (``cache`` or ``past_key_values``), or None."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_ARGUMENT_NAMES if name in parameters), None)


def is_cache_argument(name: str) -> bool:
    """Whether an input called ``name`` is a KV cache, in any spelling."""
    return name in CACHE_ARGUMENT_NAMES


def cache_keyword(function: Callable[..., Any], cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for calling ``function``; a function that names neither gets the current name."""
    return {cache_argument(function) or CACHE_ARGUMENT_NAMES[0]: cache}


def returned_cache(output: Mapping[str, Any]) -> Any:
    """The cache a model returned (``output.cache``, ``output.past_key_values`` before 5.24), or None.

    Read as a mapping key, not an attribute: 5.24 keeps ``past_key_values`` as a property that
    warns on every read.
    """
    for name in CACHE_ARGUMENT_NAMES:
        if name in output.keys():
            return output[name]
    return None
