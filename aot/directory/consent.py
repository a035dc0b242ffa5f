"""Code from a build directory runs only with its user's consent.

A build directory holds code: ``graph_module/module.py``, and ``recipe.yaml``, whose
``model.factory`` imports and calls a function when ``aot validate`` or ``aot bench`` rebuild
the eager model. Its manifest proves nothing on its own: whoever can write the directory can
rewrite a file and re-hash the manifest. So, as transformers refuses remote code without
``trust_remote_code=True`` and git a repository it does not own unless it is marked safe,
aot runs code from a directory (``aot run --runtime torch``, ``aot.load(..., runtime="torch")``,
``aot validate``, ``aot bench``) only when one of these holds:

- the caller gave the manifest's sha256 (``--expect-sha256``), which covers every file;
- the caller named a public key whose OpenSSF model signature verifies over every file (``--public-key``,
  ``aot.load(..., public_key=...)``): the manifest's sha256 as signed then serves as ``--expect-sha256``
  (:func:`aot.directory.signed.signed_manifest_sha256`);
- this machine built it: ``aot build`` records each manifest's sha256 it wrote in
  ``built-here.txt`` under aot's cache directory (``$AOT_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/aot``, else ``~/.cache/aot``);
- the caller says so (``--trust-code``, ``trust_code=True``).

Otherwise the command stops with one line and exit 7 before anything from the directory is
imported. The ONNX path runs no code (an ONNX model is data) and needs none of this.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from aot.errors import IntegrityError

log = logging.getLogger(__name__)

RECORD_NAME = "built-here.txt"


def cache_directory() -> Path:
    """aot's cache directory: ``$AOT_CACHE_DIR``, else ``$XDG_CACHE_HOME/aot``, else ``~/.cache/aot``."""
    if os.environ.get("AOT_CACHE_DIR"):
        return Path(os.environ["AOT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aot"


def built_here(manifest_sha256: str) -> bool:
    """Whether this machine's ``aot build`` wrote a manifest with this sha256."""
    try:
        lines = (cache_directory() / RECORD_NAME).read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return False
    return manifest_sha256 in lines


def remember_build(manifest_sha256: str) -> None:
    """Record a manifest this machine wrote; a cache that cannot be written costs only the record (logged)."""
    record = cache_directory() / RECORD_NAME
    if built_here(manifest_sha256):
        return
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        with record.open("a", encoding="ascii") as stream:
            stream.write(manifest_sha256 + "\n")
    except OSError as error:
        log.warning("could not record the build in %s (%s): running its code later will need --trust-code", record, error.strerror or error)


def require_consent(directory: Path, manifest_sha256: str, expect_sha256: str | None, trust_code: bool, command: str) -> str:
    """Why code from ``directory`` may run (see the module docstring); IntegrityError (exit 7) when nothing says so.

    Call it after the files were checked against the manifest (``expect_sha256`` was compared there).
    """
    if expect_sha256 is not None:
        return "its manifest's sha256 was given (or signed by the public key given)"
    if built_here(manifest_sha256):
        return "this machine built it"
    if trust_code:
        return "--trust-code"
    raise IntegrityError(
        f"{directory}: {command} would run code from this directory (module.py, recipe.yaml's factory), which this machine "
        f"did not build: give its manifest's digest (--expect-sha256 {manifest_sha256}) once you trust it, the public key "
        "whose signature it carries (--public-key), or --trust-code"
    )
