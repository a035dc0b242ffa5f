"""``model.weights_dtype``: build float32 artifacts from a bfloat16 checkpoint at the checkpoint's memory.

A recipe that computes in ``model.dtype: float32`` used to widen every weight of a
bfloat16 checkpoint on load: a 1B-parameter Llama took 4.9 GB before the first pass ran.
With ``weights_dtype: bfloat16`` the model loads as the checkpoint stores it (transformers
maps the safetensors file: nothing is read until used), and then

- every ``nn.Linear`` becomes an :class:`aot.runtime.upcast_weights.UpcastLinear` and every
  ``nn.Embedding`` an ``UpcastEmbedding``: their weights stay narrow and are widened where
  they are used (exactly: bfloat16 and float16 values are float32 values);
- every other parameter and buffer (norms, biases, rotary frequencies) is widened now: they
  are small, and a model's own code multiplies them with float32 activations.

The eager model then computes what the float32 model computes, the tracer sees float32
results, and quantising passes read each weight once, from the narrow copy. After the
passes, :func:`widen_leftover_linears` turns the linear layers no pass replaced into plain
float32 ``nn.Linear`` (fast where they run); embeddings stay narrow in the artifacts.

Only a checkpoint already stored in ``weights_dtype`` qualifies: narrowing float32 weights
would round them, which is a quantisation and belongs to a pass and a gate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from aot.process.memory import page_out
from aot.runtime.upcast_weights import UpcastEmbedding, UpcastLinear

log = logging.getLogger(__name__)

_SAFETENSORS_FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def stored_float_dtypes(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Per safetensors file, the float dtypes its tensors are stored in (read from the headers only)."""
    from safetensors import safe_open

    found: dict[str, set[str]] = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as handle:
            codes = {handle.get_slice(key).get_dtype() for key in handle.keys()}
        found[path.name] = {_SAFETENSORS_FLOAT_DTYPES[code] for code in codes if code in _SAFETENSORS_FLOAT_DTYPES}
    return found


def keep_weights_narrow(model: nn.Module, compute_dtype: torch.dtype) -> int:
    """Make ``model`` compute in ``compute_dtype`` with its linear and embedding weights left as loaded.

    Returns how many layers keep narrow weights. Ties (an output projection sharing the
    embedding's table) are kept: both modules hold the one narrow tensor.
    """
    narrowed, owned = 0, set()
    for module in model.modules():
        if type(module) in _UPCAST_FORMS:
            module.__class__ = _UPCAST_FORMS[type(module)]
            module.compute_dtype = compute_dtype
            narrowed += 1
            if id(module.weight) not in owned:  # a tied weight is one Parameter: copied once
                owned.add(id(module.weight))
                module.weight.data = _owned(module.weight.data)
        kept_narrow = {"weight"} if isinstance(module, tuple(_UPCAST_FORMS.values())) else set()
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if name in kept_narrow or not tensor.is_floating_point() or tensor.dtype == compute_dtype:
                continue
            widened = tensor.detach().to(compute_dtype)
            setattr(module, name, nn.Parameter(widened, requires_grad=False) if isinstance(tensor, nn.Parameter) else widened)
    log.info("kept %d linear and embedding layers' weights narrow, computing in %s", narrowed, compute_dtype)
    return narrowed


def widen_leftover_linears(graph_module: torch.fx.GraphModule) -> list[str]:
    """Each ``UpcastLinear`` no pass replaced becomes a plain ``nn.Linear`` in its compute dtype; returns their paths.

    Widened once here rather than at every call: the artifacts run these layers at float32
    speed. Embeddings stay narrow (a lookup widens only the rows it reads).
    """
    widened = []
    for path, module in list(graph_module.named_modules()):
        if type(module) is not UpcastLinear:
            continue
        module.weight = nn.Parameter(module.weight.detach().to(module.compute_dtype), requires_grad=False)
        module.__class__ = nn.Linear
        del module.compute_dtype
        widened.append(path)
    if widened:
        log.info("widened %d linear layers no pass replaced: %s", len(widened), ", ".join(widened))
    return widened


def compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype ``model`` computes in: the one its narrow weights widen to, else its first float parameter's.

    transformers' ``model.dtype`` is the latter alone, which for a model keeping its weights
    narrow is the storage dtype: a KV cache or a mask made in it would be bfloat16.
    """
    for module in model.modules():
        if isinstance(module, tuple(_UPCAST_FORMS.values())):
            return module.compute_dtype
    return next((tensor.dtype for tensor in model.parameters() if tensor.is_floating_point()), torch.get_default_dtype())


def _owned(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight`` in memory torch owns; the file pages it was read from are let go.

    A weight transformers loaded in the checkpoint's dtype is a view of the mapped safetensors
    file, which torch cannot clone copy-on-write (``torch._lazy_clone`` refuses storage it does not
    own): the tracer's copy of every weight would be a real one, on top of the file's pages.
    Measured on the Llama-3.2-1B-shaped checkpoint, the trace took the build from 0.5 to 5.2 GB.
    Copied (0.8 s for its 2.5 GB), each weight's pages are paged out at once rather than when the
    whole mapping goes, or the copy and the file would both be resident (4.5 GB at the end of the load).
    """
    copy = weight.clone()
    page_out(weight)
    return copy


_UPCAST_FORMS = {nn.Linear: UpcastLinear, nn.Embedding: UpcastEmbedding}
