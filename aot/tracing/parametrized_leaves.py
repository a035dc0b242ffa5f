"""A parametrized leaf (``weight_norm``, ``spectral_norm``...) in a traced GraphModule that pickles.

``torch.nn.utils.parametrize`` gives each parametrized module a class of its own, made at run time
(``ParametrizedConv1d``), whose ``__getstate__`` refuses pickling: torch supports such modules "only through
state_dict()". A traced GraphModule is pickled whole, though (transformers' fx tests, ``torch.save(gm)``,
multiprocessing), and wav2vec2's and HuBERT's positional convolution is such a leaf, so their graphs could not be.

The GraphModule's copy of such a leaf gets a class of its own too, the same as torch's but for ``__reduce_ex__``: it
pickles as the plain module (a ``Conv1d`` without its ``weight``), its parametrization modules and their original
tensors (weight_norm's ``g`` and ``v``). Loading rebuilds it with torch's public API, ``register_parametrization``,
then puts the original tensors back exactly (registering derives them anew, through ``right_inverse``). So the copy
computes what the model's module computes, from the same parameters under the same names, and
``type_before_parametrizations`` still names the plain class (what :mod:`aot.export.torch_equivalents` saves).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import parametrize


def make_picklable(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (a copy the caller owns, parametrized by torch) with a class of its own that pickles; in place."""
    module.__class__ = _class_that_pickles(type(module))
    return module


def _class_that_pickles(parametrized_class: type) -> type:
    # torch's class holds the parametrized tensors' properties and its deepcopy: kept, beside the plain class
    namespace = {key: value for key, value in vars(parametrized_class).items() if key not in ("__dict__", "__weakref__")}
    namespace["__reduce_ex__"] = _reduce_ex
    return type(parametrized_class.__name__, parametrized_class.__bases__, namespace)


def _reduce_ex(module: torch.nn.Module, protocol: int) -> tuple[Any, tuple]:
    state = {key: _without_local_functions(value) if key.endswith("_hooks") else value for key, value in vars(module).items()}
    state["_modules"] = {name: child for name, child in module._modules.items() if name != "parametrizations"}
    chains = {name: (list(chain), dict(chain._parameters)) for name, chain in module.parametrizations.items()}
    return _rebuild, (parametrize.type_before_parametrizations(module), state, chains)


def _without_local_functions(hooks: Any) -> Any:
    """The hooks pickle can name: ``weight_norm`` registers a function local to it (which reads a state_dict's old
    ``weight_g`` / ``weight_v`` names), and pickle names functions by where they are defined."""
    if not isinstance(hooks, dict):
        return hooks
    kept = type(hooks)()  # an OrderedDict stays one
    for key, hook in hooks.items():
        if "<locals>" not in getattr(getattr(hook, "hook", hook), "__qualname__", ""):
            kept[key] = hook
    return kept


def _rebuild(plain_class: type, state: dict[str, Any], chains: dict[str, tuple[list[torch.nn.Module], dict[str, Any]]]):
    module = plain_class.__new__(plain_class)
    module.__dict__.update(state)
    for name, (parametrizations, originals) in chains.items():
        tensors = list(originals.values())  # original, or original0, original1... in the order torch made them
        with torch.no_grad():
            value = parametrizations[0](*tensors)
            for parametrization in parametrizations[1:]:
                value = parametrization(value)
        module.register_parameter(name, torch.nn.Parameter(value.detach().clone(), requires_grad=tensors[0].requires_grad))
        for parametrization in parametrizations:
            parametrize.register_parametrization(module, name, parametrization, unsafe=True)
        module.parametrizations[name]._parameters.update(originals)
    return make_picklable(module)
