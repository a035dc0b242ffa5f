"""The C library, for the few calls Python does not wrap: malloc_trim, prctl, renameat2."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library this process already runs on; None where there is no such thing to load.

    ``ctypes.CDLL(None)`` opens the process's own symbols, libc's among them. It is not
    ``ctypes.util.find_library("c")``, which runs ``ldconfig`` in a subprocess: a fork, during
    which a Ctrl-C or SIGTERM would be raised inside fork's callbacks and lost there.
    """
    try:
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError):  # TypeError: Windows has no "this process" library
        return None


def function(name: str):
    """``name`` in the C library, or None where the library or the function is missing."""
    library = libc()
    return getattr(library, name, None) if library is not None else None
