"""Import modules on a thread while the main thread waits on work that does not hold the GIL.

Drawing BERT-base's random weights is 0.7 s of ``uniform_`` and ``normal_`` kernels, which
release the GIL, on one core of two. Importing what the build needs next (the ONNX exporter,
onnxscript's function library and rewriter, ONNX Runtime: 0.7 s of Python on its own) fits
into that time, instead of following it on the build's critical path in the export child.

While the thread runs, the interpreter's switch interval is 0.2 ms instead of 5 ms: the main
thread takes the GIL back after each of its ~200 kernels, and at 5 ms a return waited on the
importing thread so often that the two took as long side by side as one after the other
(1.45 s here, against 1.07 s at 0.2 ms; AMD EPYC, 2 cores).

The thread is always joined before the context ends: a process forked while another of its
threads holds an import lock would inherit that lock held, forever. An import that fails on
the thread is left for the code that needs the module to import, and report, itself.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

log = logging.getLogger(__name__)

_SWITCH_INTERVAL_S = 0.0002


@contextmanager
def imports_beside(modules: Sequence[str]) -> Iterator[None]:
    """Import ``modules`` on a thread while the block runs; both are done when it ends."""
    if not modules:
        yield
        return
    thread = threading.Thread(target=_import_each, args=(tuple(modules),), name="aot-imports", daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    thread.start()
    try:
        yield
    finally:
        thread.join()
        sys.setswitchinterval(interval)


def _import_each(modules: tuple[str, ...]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as error:  # the build imports it again where it is needed, and reports it there
            log.debug("importing %s beside the build failed: %s: %s", module, type(error).__name__, error)
