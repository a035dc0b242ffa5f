"""Rebuild a ``torch.nn`` leaf module from a constructor call, without pickle.

A saved artifact recreates each ``call_module`` target as source text such as
``torch.nn.Conv2d(3, 8, kernel_size=(3, 3), padding=(1, 1))``. The arguments
are read from the module's attributes by the names of its ``__init__``
parameters, which is how every ``torch.nn`` class stores them (``in_features``,
``kernel_size``, ``eps``...); a ``bias`` stored as a tensor or ``None`` becomes
``bias=True/False``. The call is then checked, not trusted: it is built on the
meta device and must give the same class, the same ``extra_repr`` and the same
parameter and buffer shapes as the original, or the module has no
constructor form.
"""

from __future__ import annotations

import inspect
import math

import torch

_SKIPPED_PARAMETERS = {"self", "device", "dtype"}
_LITERAL_TYPES = (bool, int, float, str, type(None))


class NoConstructorForm(Exception):
    """The module cannot be recreated from a constructor call; the message says why."""


RUNTIME_PACKAGE = "aot.runtime."


def is_runtime_class(cls: type) -> bool:
    """Classes of ``aot.runtime``: self-contained torch-only modules whose source a saved module carries."""
    return cls.__module__.startswith(RUNTIME_PACKAGE)


def constructor_call(module: torch.nn.Module) -> str:
    """Return Python source that constructs a module equal to ``module`` (weights aside)."""
    cls = type(module)
    if not cls.__module__.startswith("torch.") and not is_runtime_class(cls):
        raise NoConstructorForm(f"{cls.__module__}.{cls.__qualname__} is not a torch class")
    kwargs = _constructor_kwargs(module)
    _check_rebuild(module, kwargs)
    arguments = ", ".join(f"{name}={python_literal(value)}" for name, value in kwargs.items())
    return f"{class_path(cls)}({arguments})"


def class_path(cls: type) -> str:
    """``torch.nn.Linear`` rather than ``torch.nn.modules.linear.Linear`` where torch.nn exports the class."""
    if getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    if is_runtime_class(cls):
        return cls.__qualname__  # defined in module.py itself, from the pasted aot.runtime source
    return f"{cls.__module__}.{cls.__qualname__}"


def python_literal(value) -> str:
    """Source text for a constructor argument; only literals round-trip."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, _LITERAL_TYPES):
        return repr(value)
    if isinstance(value, torch.Size):
        return python_literal(tuple(value))
    if isinstance(value, (tuple, list)):
        items = ", ".join(python_literal(item) for item in value)
        if isinstance(value, tuple):
            return f"({items},)" if len(value) == 1 else f"({items})"
        return f"[{items}]"
    if isinstance(value, torch.dtype):
        return str(value)
    raise NoConstructorForm(f"argument value {value!r} of type {type(value).__name__} is not a literal")


def _constructor_kwargs(module: torch.nn.Module) -> dict:
    signature = inspect.signature(type(module).__init__)
    kwargs = {}
    for name, parameter in signature.parameters.items():
        if name in _SKIPPED_PARAMETERS or name.startswith("_"):
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        has_default = parameter.default is not inspect.Parameter.empty
        if not hasattr(module, name):
            if has_default:
                continue
            raise NoConstructorForm(f"constructor argument '{name}' is not stored on the module")
        value = getattr(module, name)
        if isinstance(value, torch.Tensor) or (value is None and isinstance(parameter.default, bool)):
            value = value is not None
        if has_default and _same_literal(value, parameter.default):
            continue
        kwargs[name] = value
    return kwargs


def _same_literal(value, default) -> bool:
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # tensors or odd types never count as the default
        return False


def _check_rebuild(module: torch.nn.Module, kwargs: dict) -> None:
    cls = type(module)
    try:
        with torch.device("meta"):
            rebuilt = cls(**kwargs)
    except Exception as error:
        raise NoConstructorForm(f"{cls.__name__}(**{kwargs}) fails: {error}") from None
    if rebuilt.extra_repr() != module.extra_repr():
        raise NoConstructorForm(f"rebuilt as '{rebuilt.extra_repr()}', not '{module.extra_repr()}'")
    if _tensor_shapes(rebuilt) != _tensor_shapes(module):
        raise NoConstructorForm("rebuilt module holds different parameters or buffers")


def _tensor_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(tensor.shape) for name, tensor in module.named_parameters(remove_duplicate=False)}
    shapes.update({name: tuple(tensor.shape) for name, tensor in module.named_buffers(remove_duplicate=False)})
    return shapes
