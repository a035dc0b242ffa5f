"""Keep the eager model exactly as it was while it is traced.

Tracing runs the model's Python code with proxies: code that caches a value on
``self`` (``self._cache = x``), installs hooks (transformers' output capture)
or flips a config field would leave proxies or new state on the model.
``preserved_model_state`` snapshots every module's ``__dict__`` (and the dicts
of parameters, buffers, submodules and hooks inside it) and every config
reachable from a module, and puts all of it back on exit, listing what it had
to restore.

``traceable_experts`` computes mixture-of-experts layers with transformers'
``batched_mm`` implementation while tracing: the default ``grouped_mm`` sorts the
tokens by expert and cuts them into groups whose sizes depend on the routing (data
that no graph can branch on, and an op registered outside torch that no artifact can
save), and the ``eager`` loop visits only the experts some token chose. ``batched_mm``
gathers each token's chosen experts' weights and runs one batched matmul: the same sums
for any routing, in torch ops both frontends trace and both artifacts save.

``disable_hooked_forward`` takes accelerate's hooks off (``module.forward`` is
the hooked wrapper, ``module._old_forward`` the original) for the duration of
the trace and always puts them back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_MISSING = object()


def _snapshot(obj: Any) -> tuple[dict, dict]:
    state = dict(obj.__dict__)
    nested = {key: dict(value) for key, value in state.items() if isinstance(value, dict) and key.startswith("_")}
    return state, nested


def _restore(obj: Any, label: str, state: dict, nested: dict, restored: list[str]) -> None:
    current = obj.__dict__
    for key in [key for key in current if key not in state]:
        del current[key]
        restored.append(f"{label}{key} (added during tracing)")
    for key, value in state.items():
        if current.get(key, _MISSING) is not value:
            current[key] = value
            restored.append(f"{label}{key}")
    for key, saved in nested.items():
        live = current[key]
        if live.keys() != saved.keys() or any(live[name] is not item for name, item in saved.items()):
            live.clear()
            live.update(saved)
            restored.append(f"{label}{key}")


def module_configs(model: torch.nn.Module) -> list[Any]:
    """Every distinct config a module of ``model`` holds, in module order (an encoder-decoder's stacks keep their own)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = module.__dict__.get("config")
        if config is not None and hasattr(config, "__dict__"):
            found.setdefault(id(config), config)
    return list(found.values())


@contextlib.contextmanager
def preserved_model_state(model: torch.nn.Module) -> Iterator[list[str]]:
    """Yields the list it fills, on exit, with the attributes it had to put back."""
    restored: list[str] = []
    modules = [(name, module, *_snapshot(module)) for name, module in model.named_modules()]
    configs = [(config, *_snapshot(config)) for config in module_configs(model)]
    try:
        yield restored
    finally:
        for name, module, state, nested in modules:
            _restore(module, f"{name}." if name else "", state, nested, restored)
        for config, state, nested in configs:
            _restore(config, "config.", state, nested, restored)


@contextlib.contextmanager
def config_use_cache_off(model: torch.nn.Module) -> Iterator[bool]:
    """``use_cache`` False inside, so that no decoder builds a KV cache object; yields whether the model's was on.

    Every config reachable from a module: an encoder-decoder's decoder stack (T5's) holds a copy of
    the config of its own, and builds an ``EncoderDecoderCache`` from it whatever the model's says.
    """
    if not getattr(getattr(model, "config", None), "use_cache", False):
        yield False
        return
    caching = [config for config in module_configs(model) if getattr(config, "use_cache", False) is True]
    for config in caching:
        config.use_cache = False
    try:
        yield True
    finally:
        for config in caching:
            config.use_cache = True


TRACEABLE_EXPERTS = "batched_mm"


@contextlib.contextmanager
def traceable_experts(model: torch.nn.Module) -> Iterator[str | None]:
    """Experts layers on ``batched_mm`` inside; yields the trace report's note on it, or None when nothing changed."""
    can_set = getattr(type(model), "_can_set_experts_implementation", None)
    config = getattr(model, "config", None)
    current = getattr(config, "_experts_implementation", None)
    if not callable(can_set) or not can_set() or current in (None, TRACEABLE_EXPERTS):
        yield None
        return
    before = model.get_experts_implementation()
    model.set_experts_implementation(TRACEABLE_EXPERTS)
    try:
        yield f"experts traced with transformers' {TRACEABLE_EXPERTS} implementation (the model's is {current})"
    finally:
        model.set_experts_implementation(before)


@contextlib.contextmanager
def disable_hooked_forward(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run with accelerate's forward hooks removed; they are always restored."""
    hooked = [
        (module, module.__dict__["forward"])
        for module in model.modules()
        if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__ and "forward" in module.__dict__
    ]
    try:
        for module, _ in hooked:
            module.__dict__["forward"] = module.__dict__["_old_forward"]
        yield model
    finally:
        for module, forward in hooked:
            module.__dict__["forward"] = forward
