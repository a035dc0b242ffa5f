"""Copy the source of aot's pure-torch leaf functions into a saved module.

The tracer keeps some functions whole (``aot/tracing/torch_functions.py``);
a saved graph calls them by name, and the artifact may not import aot, so
their source travels with it. A copied function may use torch, the standard
library, literal constants and other functions of aot; the free names of its
code are resolved against its module's globals and each becomes an import, a
constant or another copied function. Anything else fails the export.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import textwrap
import types

import torch

from aot.errors import ExportError

from .leaf_constructor import python_literal


def is_aot_function(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return isinstance(obj, types.FunctionType) and (module == "aot" or module.startswith("aot."))


def is_allowed_module(name: str) -> bool:
    """torch and the standard library are all a saved module may import."""
    root = name.split(".")[0]
    return root == "torch" or root in sys.stdlib_module_names


class FunctionSources:
    """Collects copied functions and the imports and constants they need, in first-use order."""

    def __init__(self) -> None:
        self.imports: dict[str, str] = {}  # bound name -> import statement
        self.constants: dict[str, str] = {}  # bound name -> assignment
        self.functions: dict[str, str] = {}  # qualified name -> source
        self._bound: dict[str, object] = {}

    def add(self, fn: types.FunctionType, node_name: str) -> str:
        """Copy ``fn`` (and what it uses); return the name it is defined under in the saved module."""
        fn = inspect.unwrap(fn)
        key = f"{fn.__module__}.{fn.__qualname__}"
        if key in self.functions:
            return fn.__name__
        if fn.__closure__ or "<locals>" in fn.__qualname__:
            raise ExportError(f"node '{node_name}' calls {key}, a closure; only module-level functions can be copied")
        self._bind(fn.__name__, fn, node_name)
        self.functions[key] = ""  # reserve first, so recursion terminates
        self.functions[key] = _function_source(fn, key, node_name)
        for name in sorted(_free_names(fn.__code__)):
            self._add_dependency(fn, name, node_name)
        return fn.__name__

    def _add_dependency(self, fn, name: str, node_name: str) -> None:
        if name in fn.__globals__:
            value = fn.__globals__[name]
        elif hasattr(builtins, name):
            return
        else:
            return  # an attribute name, not a global
        if name in self._bound and self._bound[name] is value:
            return
        if isinstance(value, types.ModuleType):
            if not is_allowed_module(value.__name__):
                raise ExportError(
                    f"node '{node_name}' calls {fn.__module__}.{fn.__qualname__}, which uses module"
                    f" {value.__name__}; a saved module may import only torch and the standard library"
                )
            self._bind(name, value, node_name)
            statement = f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
            self.imports[name] = statement
        elif is_aot_function(value):
            self.add(value, node_name)
        elif _is_literal(value):
            self._bind(name, value, node_name)
            self.constants[name] = f"{name} = {python_literal(value)}"
        elif is_allowed_module(getattr(value, "__module__", "") or "") and _importable_as(value, name):
            self._bind(name, value, node_name)
            self.imports[name] = f"from {value.__module__} import {value.__qualname__} as {name}"
        else:
            raise ExportError(
                f"node '{node_name}' calls {fn.__module__}.{fn.__qualname__}, which uses global '{name}'"
                f" ({type(value).__name__}) that cannot be copied into a torch-only module"
            )

    def _bind(self, name: str, value, node_name: str) -> None:
        if name in self._bound and self._bound[name] is not value:
            raise ExportError(f"node '{node_name}': two copied functions need different objects named '{name}'")
        self._bound[name] = value


def _function_source(fn: types.FunctionType, key: str, node_name: str) -> str:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as error:
        raise ExportError(f"node '{node_name}' calls {key}, whose source cannot be read: {error}") from None
    definition = ast.parse(source).body[0]
    if definition.decorator_list:  # decorators (e.g. torch.fx.wrap) only matter to the tracer
        source = "\n".join(source.splitlines()[definition.lineno - 1 :]) + "\n"
    return source


def _free_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _free_names(constant)
    return names


def _is_literal(value) -> bool:
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype)):
        return True
    return isinstance(value, tuple) and all(_is_literal(item) for item in value)


def _importable_as(value, name: str) -> bool:
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    qualname = getattr(value, "__qualname__", "")
    return module is not None and "." not in qualname and getattr(module, qualname, None) is value
