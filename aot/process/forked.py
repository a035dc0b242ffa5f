"""Run one build step in a forked child process, so that nothing it allocates outlives it.

The ONNX export is such a step: torch.export, the ONNX translation and onnxscript's
rewrite rules keep module-level caches that hold on to the exported graph, and with
it the GraphModule's weights, for the rest of the process. A forked child shares the
parent's memory copy-on-write (the weights are not copied), does the work, reports
back through a pipe and exits, and the operating system takes back everything it held.

The child runs torch single-threaded: the OpenMP runtime's worker threads do not
survive ``fork`` and a parallel region in the child would wait for them forever. The
export is Python-bound, so it loses nothing.

The child never outlives the parent: it asks the kernel for SIGKILL when the parent dies
(``PR_SET_PDEATHSIG``, even when the parent itself is SIGKILLed), and the parent kills it
whenever it stops waiting for it (an error elsewhere, Ctrl-C, SIGTERM).

Where ``fork`` is missing (Windows) or unsafe (macOS frameworks), or where this
process has initialised CUDA (a forked child cannot use it: "Cannot re-initialize
CUDA in forked subprocess"), the step runs in process instead, when its result is
asked for.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any

from aot.errors import AotError, ExportError
from aot.process.libc import function

log = logging.getLogger(__name__)


def can_fork() -> bool:
    torch = sys.modules.get("torch")
    cuda_in_use = torch is not None and torch.cuda.is_initialized()
    return sys.platform == "linux" and hasattr(os, "fork") and not cuda_in_use


class ForkedStep:
    """A step running in a forked child; :meth:`result` waits for it.

    ``on_child(pid)`` is called once the child runs (memory accounting follows it).
    An AotError in the child is raised again by :meth:`result` with its type and message;
    any other exception comes back as an ExportError naming ``step``.
    """

    def __init__(self, step: str, function: Callable[[], Any], on_child: Callable[[int], None] | None = None):
        self.step = step
        self._function: Callable[[], Any] | None = None
        self._read_end: int | None = None
        self._status: int | None = None
        self.in_process = not can_fork()
        if self.in_process:
            self._function = function  # run in process, when the result is asked for
            return
        read_end, write_end = os.pipe()
        # Objects alive now are left out of the child's garbage collections: a collection would
        # write to every object's header and so copy every page of the parent's heap into the child.
        gc.freeze()
        parent = os.getpid()
        # SIGINT and SIGTERM wait until the fork is done: a Python handler that raised inside
        # fork's own callbacks (logging's lock release) would see its exception swallowed there.
        stopping = {signal.SIGINT, signal.SIGTERM}
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
        try:
            self.pid = os.fork()
            if self.pid == 0:  # the child: never returns, never runs the parent's cleanup
                os.close(read_end)
                die_with_parent(parent)
                _child(function, write_end, masked)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        gc.unfreeze()
        os.close(write_end)
        self._read_end = read_end
        if on_child is not None:
            on_child(self.pid)

    def result(self) -> Any:
        """The function's result, or its AotError raised again here."""
        if self._function is not None:
            return self._function()
        try:
            with os.fdopen(self._take_read_end(), "rb") as pipe:
                payload = pipe.read()
        except BaseException:  # interrupted while waiting: the child's work is wasted, stop it now
            self.cancel()
            raise
        status = self._reap()
        if not payload:
            raise ExportError(f"{self.step}: the child process died ({_describe(status)}) before it reported")
        outcome, value = pickle.loads(payload)
        if outcome == "ok":
            return value
        if outcome == "aot":
            error_type, message = value
            raise error_type(message)
        raise ExportError(f"{self.step} failed: {value}")

    def cancel(self) -> None:
        """Stop the child (the parent failed elsewhere, or was interrupted) and reap it; safe to call twice."""
        if self._function is not None or self._status is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap()
        read_end = self._take_read_end()
        if read_end is not None:
            os.close(read_end)

    def _take_read_end(self) -> int | None:
        read_end, self._read_end = self._read_end, None
        return read_end

    def _reap(self) -> int:
        """Wait for the child once; its pid may belong to another process after that, so it is never signalled again."""
        if self._status is None:
            _, self._status = os.waitpid(self.pid, 0)
        return self._status


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; die now if it already has.

    Used by the forked export and by the bench's worker processes.
    """
    prctl = function("prctl")
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _child(function: Callable[[], Any], write_end: int, signal_mask: set[signal.Signals]) -> None:
    code = 1
    try:
        import torch

        torch.set_num_threads(1)
        for signal_number in (signal.SIGINT, signal.SIGTERM):  # they end the child; the parent reports them
            signal.signal(signal_number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
        try:
            result: tuple[str, Any] = ("ok", function())
        except AotError as error:
            result = ("aot", (type(error), str(error)))
        except Exception as error:  # reported to the parent, which raises it as a failure of the step
            result = ("error", f"{type(error).__name__}: {error}")
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(pickle.dumps(result))
        code = 0
    except BrokenPipeError:  # the parent stopped listening (interrupted, or failed elsewhere): nothing to say
        pass
    except BaseException:  # even here the child must not fall back into the parent's code
        log.debug("forked child failed", exc_info=True)
    finally:
        os._exit(code)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"
