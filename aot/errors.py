"""Error types and the exit codes the CLI maps them to.

Every error aot raises on bad input derives from :class:`AotError`; its
``exit_code`` is the documented process exit status and ``str(error)`` is a
single line that names the file, key or node at fault.
"""

from __future__ import annotations

import re

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class AotError(Exception):
    """Base class of every error aot reports to the user."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()) if "\n" in str(message) else str(message))


class RecipeError(AotError):
    """The recipe or the command line is wrong: bad YAML, unknown key, wrong type, missing file."""

    exit_code = 2
    kind = "recipe"


class TraceError(AotError):
    """The model could not be captured as a graph."""

    exit_code = 3
    kind = "trace"


class PassError(AotError):
    """A graph pass failed or broke the graph it was given."""

    exit_code = 4
    kind = "pass"


class ValidationError(AotError):
    """Outputs of a built artifact differ from the eager model beyond the recipe's tolerances."""

    exit_code = 5
    kind = "validation"


class ExportError(AotError):
    """An artifact could not be written or checked."""

    exit_code = 6
    kind = "export"


class IntegrityError(AotError):
    """A saved artifact no longer matches the hash its manifest recorded."""

    exit_code = 7
    kind = "integrity"


EXIT_CODES = {
    0: "success",
    1: "internal error (a bug in aot: please report it with the traceback from --debug)",
    RecipeError.exit_code: "bad recipe or usage",
    TraceError.exit_code: "trace failure",
    PassError.exit_code: "pass failure",
    ValidationError.exit_code: "validation failure",
    ExportError.exit_code: "export failure",
    IntegrityError.exit_code: "artifact integrity failure (hash mismatch or missing file)",
    130: "interrupted (SIGINT, Ctrl-C)",
    143: "terminated (SIGTERM)",
}


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, without terminal colours: what a one-line report keeps."""
    text = _ANSI_ESCAPE.sub("", str(error)).strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)


def did_you_mean(name: str, known: list[str] | tuple[str, ...] | set[str], limit: int = 3) -> str:
    """`` (did you mean 'a' or 'b'?)`` naming up to ``limit`` of ``known`` closest to ``name``; empty when none is close.

    difflib's ratio, with the cutoff of 0.6 that keeps unrelated names out of the message.
    """
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=limit, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(match) for match in close)}?)" if close else ""
