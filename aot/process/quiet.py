"""Keep torch's own failure reports off the terminal while aot runs one of torch's tools.

When torch.export, the fx tracer's fake tensors or the ONNX exporter fail, they report
it themselves before they raise: warnings and errors logged through torch's loggers
(which write to stderr through handlers of their own, whatever the root logger's level),
partial graphs printed to ``sys.stderr``, Python warnings. That is 20 to 50 lines ahead of
aot's error, which is one line naming the fault, the useful first line of torch's error
kept in it.

Inside ``with quiet_torch("torch.export"):``

- unless aot logs at DEBUG (``aot --debug``), the loggers of torch and of the ONNX
  exporter's libraries are held above CRITICAL and Python warnings are ignored;
- what the block prints to ``sys.stdout`` or ``sys.stderr`` is captured, and logged at
  DEBUG when the block ends, so ``--debug`` still shows it.

Everything is as before once the block ends. Whether aot logs at DEBUG is read from the
``aot`` logger's effective level (the root logger's, unless the ``aot`` logger has its
own), when the block starts: a forked child, which inherits the logging set-up, decides
as its parent would.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Sequence

logger = logging.getLogger(__name__)

# torch, and what its ONNX exporter is built on: their loggers are what a failed export writes to.
QUIETED_PACKAGES = ("torch", "onnxscript", "onnx_ir")
_SILENT = logging.CRITICAL + 1


def aot_debugging() -> bool:
    """Whether aot logs at DEBUG (``aot --debug``, or a library user's logging set-up)."""
    return logging.getLogger("aot").getEffectiveLevel() <= logging.DEBUG


@contextlib.contextmanager
def quiet_torch(task: str, packages: Sequence[str] = QUIETED_PACKAGES) -> Iterator[None]:
    """Run the block with ``packages``' logs, warnings and prints kept quiet; see the module docstring.

    ``task`` names the call in the DEBUG record of what it printed.
    """
    captured = io.StringIO()
    try:
        with contextlib.ExitStack() as stack:
            if not aot_debugging():
                stack.enter_context(_held_loggers(packages))
                stack.enter_context(_ignored_warnings())
            # Only calls that look sys.stdout / sys.stderr up as they print are captured: logging
            # handlers keep the stream they were made with, so --debug's log lines are not.
            stack.enter_context(contextlib.redirect_stdout(captured))
            stack.enter_context(contextlib.redirect_stderr(captured))
            yield
    finally:
        printed = captured.getvalue().strip()
        if printed:
            logger.debug("%s printed:\n%s", task, printed)


@contextlib.contextmanager
def _held_loggers(packages: Sequence[str]) -> Iterator[None]:
    held = _loggers_with_levels(packages)
    saved = [(held_logger, held_logger.level) for held_logger in held]
    for held_logger in held:
        held_logger.setLevel(_SILENT)
    try:
        yield
    finally:
        for held_logger, level in saved:
            held_logger.setLevel(level)


def _loggers_with_levels(packages: Sequence[str]) -> list[logging.Logger]:
    """Each package's logger, and those of its descendants with a level of their own.

    The others (and any made while the block runs) inherit their level from these.
    """
    prefixes = tuple(f"{package}." for package in packages)
    descendants = [
        candidate
        for name, candidate in list(logging.Logger.manager.loggerDict.items())
        if name.startswith(prefixes) and isinstance(candidate, logging.Logger) and candidate.level != logging.NOTSET
    ]
    return [logging.getLogger(package) for package in packages] + descendants


@contextlib.contextmanager
def _ignored_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
