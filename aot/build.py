"""Deprecated: ``aot.build`` is now :mod:`aot.builder` (a folder named ``build`` reads as build output to tools).

``from aot.build import build`` still works and warns once; import from :mod:`aot.builder` instead.
"""

import warnings

_MOVED = ("build", "BuildReport", "default_output")


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(f"aot.build.{name} moved to aot.builder.{name}; aot.build goes in 0.3", DeprecationWarning, stacklevel=2)
        import aot.builder

        return getattr(aot.builder, name)
    raise AttributeError(f"module 'aot.build' has no attribute '{name}'")
