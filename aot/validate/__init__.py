"""``aot validate DIR``: a build directory checked again, files first, then every artifact against eager.

- :mod:`~aot.validate.directory`: :func:`validate_directory` and its :class:`DirectoryReport`.

What it is built from lives below: the comparison rule and the gates in :mod:`aot.gates`, each artifact's checks
in :mod:`aot.builder.checks`, the directory's manifest, integrity and consent in :mod:`aot.directory`.
``from aot.validate import validate_directory`` imports torch only when first asked for.
"""

import importlib

_NAMES = {"validate_directory": "directory", "DirectoryReport": "directory"}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    # importlib, not ``from aot.validate import directory``: that statement asks this module for ``directory``
    # first, which would call this function again, without end, whenever the submodule is not yet imported.
    if name not in _NAMES:
        raise AttributeError(f"module 'aot.validate' has no attribute '{name}'")
    return getattr(importlib.import_module(f"aot.validate.{_NAMES[name]}"), name)
