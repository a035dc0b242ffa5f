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


# What each exit status means; README.md's table says the same (tests/test_docs.py holds them equal).
EXIT_CODES = {
    0: "success",
    1: "internal error (a bug in aot; `--debug` shows the traceback)",
    RecipeError.exit_code: (
        "bad recipe or usage: malformed or oversized YAML, unknown key, wrong type, value out of range, "
        "unknown pass, missing or unreadable file, unknown input, a factory that raises, an output directory "
        "aot may not replace or cannot write"
    ),
    TraceError.exit_code: "trace failure",
    PassError.exit_code: "pass failure",
    ValidationError.exit_code: "validation failure: an artifact differs from eager beyond the recipe's tolerances",
    ExportError.exit_code: (
        "export failure (a full disk included; an AOTInductor package whose process died loading or "
        "running it)"
    ),
    IntegrityError.exit_code: (
        "artifact integrity failure: a file differs from the manifest's sha256, is missing, is a link, lies "
        "outside the directory or is not listed; a manifest that is not an aot manifest or not the "
        "`--expect-sha256` one; code from a directory this machine did not build, with neither "
        "`--expect-sha256`, a verified `--public-key` nor `--trust-code`; a signature that does not verify "
        "(another key, a file changed since signing) or provenance of another manifest; `aot validate --recipe` "
        "naming a recipe other than the one built"
    ),
    130: "interrupted (Ctrl-C, SIGINT)",
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
