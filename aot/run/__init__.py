"""Use a build directory: :func:`load` (``aot.load``) and the ``aot run`` command's library side."""

from .built_model import POOLINGS, BuiltModel, load

__all__ = ["POOLINGS", "BuiltModel", "load"]
