"""Input names as callers spell them, bound to the parameters of the model's ``forward``.

A graph's placeholders are named exactly as the caller's ``input_names`` say, and the traced
root calls the model with each as a keyword. The two differ in one case: the KV cache.
transformers 5.24 renamed the decoder forward's ``past_key_values`` to ``cache``; the old keyword
still reaches the model through ``**kwargs`` (with a FutureWarning until 5.40), and code written
for Optimum, or against transformers' own fx tests, still says ``past_key_values``. Either spelling
binds to whichever the forward declares (:mod:`aot.compat.transformers_cache`), and the graph keeps
the caller's name, so ``gm(past_key_values=...)`` works where it was traced so.
"""

from __future__ import annotations

from collections.abc import Sequence

from aot.compat.transformers_cache import is_cache_argument


def forward_keyword(name: str, parameters: Sequence[str]) -> str | None:
    """The ``forward`` parameter an input called ``name`` binds to, or None when it binds to none.

    ``parameters``: the forward's named parameters (:func:`aot.tracing.dummy_inputs.forward_parameters`).
    """
    if name in parameters:
        return name
    if is_cache_argument(name):
        return next((parameter for parameter in parameters if is_cache_argument(parameter)), None)
    return None


def forward_keywords(input_names: Sequence[str], parameters: Sequence[str]) -> dict[str, str]:
    """``{input name: forward keyword}``; a name that binds to no parameter is passed as it is (``**kwargs``)."""
    return {name: forward_keyword(name, parameters) or name for name in input_names}
