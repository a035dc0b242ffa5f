"""Prove that the passes left the eager model as it was, so it can still serve as the reference.

The build computes the eager reference outputs after the passes, beside the ONNX
export, rather than before tracing (so they are off the critical path). That is
sound only while no pass changed the eager model: the traced graph shares its
leaf modules (Linear, LayerNorm...) with it, and a pass that wrote into a shared
weight would change the reference and the graph alike, and validation would
compare the graph with itself.

Passes replace what they change (a shallow copy of the layer with new
parameters), so the check is cheap: every parameter and buffer of the eager
model must still be the same tensor object, over the same memory (``.data =``
swaps it), at the same version counter (``Tensor._version`` counts in-place writes).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from aot.compat.torch_private import is_cow_tensor
from aot.errors import PassError
from aot.recipe.schema import PassSpec

_Fingerprint = dict[str, tuple[int, int, int]]


def fingerprint(model: torch.nn.Module) -> _Fingerprint:
    """``{name: (tensor id, data address, version)}`` of every parameter and buffer of ``model``."""
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    return {name: (id(tensor), _address(tensor), tensor._version) for name, tensor in named}


def _address(tensor: torch.Tensor) -> int:
    # data_ptr() would copy a copy-on-write tensor (the traced graph's weights are such clones).
    read_only_address = getattr(tensor, "const_data_ptr", None)  # torch < 2.13 lacks it
    try:
        if read_only_address is not None:
            return read_only_address()
        return 0 if is_cow_tensor(tensor) else tensor.data_ptr()
    except RuntimeError:  # sparse and other layouts without one storage
        return 0


def changed_tensor(model: torch.nn.Module, before: _Fingerprint) -> str | None:
    """The name of the first parameter or buffer that differs from ``before``, or None."""
    after = fingerprint(model)
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            return name
    return None


def check_after_each_pass(model: torch.nn.Module, specs: list[PassSpec]) -> Callable[[int, torch.fx.GraphModule], None]:
    """An ``after_each`` hook for :func:`aot.builder.pipeline.run_pipeline` that names the pass at fault."""
    before = fingerprint(model)

    def check(step: int, graph_module: torch.fx.GraphModule) -> None:
        name = changed_tensor(model, before)
        if name is not None:
            raise PassError(
                f"pass '{specs[step].name}' (step {step + 1}) changed the eager model's '{name}' in place;"
                " a pass must replace the layers it changes, not write into them"
            )

    return check
