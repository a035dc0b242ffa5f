"""The part of a decoder step's ``module.py`` that generates: ``model.generate(input_ids, attention_mask, n)``.

A build with ``generation.cache`` saves the KV-cache step, which takes and returns flat
tensors (:mod:`aot.decoding.keyword_step`). So that users can generate with torch alone,
its ``module.py`` also carries :mod:`aot.decoding.greedy` (torch and the standard library
only; pasted whole, the ``from __future__`` line dropped, since only a file's first
statement may be one), the step's input names and past layout as literals, and a
``generate`` method on ``Model``::

    model = load()
    tokens = model.generate(input_ids, attention_mask, max_new_tokens=32)  # prompt + new tokens

The build validates the artifact through this method: its tokens must be eager ``generate``'s.
``gm.meta["decoder"]`` (:meth:`~aot.decoding.keyword_step.DecoderStep.artifact_meta`) says
what to write; a graph without it gets none of this.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

_GREEDY_MODULE = "aot.decoding.greedy"
_FUTURE_IMPORT = "from __future__ import annotations\n"

GENERATE_METHOD = '''
def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None):
    """Greedy decoding with the KV cache: the tokens ``generate(do_sample=False)`` makes (prompt first).

    Left-pad a batch of prompts (``attention_mask`` 0 on the padding). With ``eos_token_id``,
    a row that produced it is padded with ``pad_token_id`` and the loop ends once every row has.
    """

    def step(*tensors):
        return list(self(**dict(zip(STEP_INPUTS, tensors))).values())

    return greedy_generate(
        step, input_ids, attention_mask, max_new_tokens,
        past_layout=PAST_LAYOUT, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
'''


def generation_section(meta: dict[str, Any] | None) -> str:
    """The greedy loop's source and the step's literals, or ``""`` for a graph that is no decoder step."""
    if meta is None:
        return ""
    source = inspect.getsource(importlib.import_module(_GREEDY_MODULE)).replace(_FUTURE_IMPORT, "", 1)
    layout = (
        "PAST_LAYOUT = PastLayout(\n"
        f"    heads_and_dims={tuple(tuple(pair) for pair in meta['heads_and_dims'])!r},\n"
        f"    dtype=torch.{meta['dtype']},\n"
        f"    takes_position_ids={meta['takes_position_ids']!r},\n"
        ")"
    )
    inputs = "STEP_INPUTS = [\n" + "".join(f"    {name!r},\n" for name in meta["inputs"]) + "]"
    return f"# --- {_GREEDY_MODULE} ---\n{source}\n\n# --- the step's inputs and past, for generate ---\n{inputs}\n{layout}"


def generate_method(meta: dict[str, Any] | None) -> str:
    """``Model.generate``'s source, or ``""``."""
    return "" if meta is None else GENERATE_METHOD
