"""Where release files go: beside the build directory by default, or at one fixed name inside it.

``aot sign out/minilm`` writes ``out/minilm.sig`` (and ``--provenance`` names its file): a file beside the
directory changes nothing inside it. A signature may also travel inside the directory, but only as
:data:`SIGNATURE_NAME` (the name model-signing's own CLI defaults to) and provenance only as
:data:`PROVENANCE_NAME`, at the top level. Those two names are what ``aot validate`` and friends tolerate beside
the files the manifest lists, and what the OMS hashing leaves out, so that a signature never covers itself.
"""

from __future__ import annotations

from pathlib import Path

SIGNATURE_NAME = "model.sig"
PROVENANCE_NAME = "provenance.intoto.jsonl"
RELEASE_FILE_NAMES = (SIGNATURE_NAME, PROVENANCE_NAME)


def signature_beside(directory: str | Path) -> Path:
    """``DIR.sig`` beside ``DIR`` (``out/minilm`` -> ``out/minilm.sig``): where ``aot sign`` writes by default."""
    resolved = Path(directory).resolve()
    return resolved.with_name(resolved.name + ".sig")


def default_signature(directory: str | Path) -> Path:
    """The signature to read when none is named: ``DIR.sig`` beside DIR, else ``DIR/model.sig``, else the former.

    The last answer names the file that is missing, for the error.
    """
    beside = signature_beside(directory)
    inside = Path(directory) / SIGNATURE_NAME
    return inside if not beside.exists() and inside.is_file() else beside


def name_inside(directory: str | Path, path: str | Path) -> str | None:
    """``path``'s name relative to ``directory`` when it lies inside it (links resolved); None when outside."""
    root, target = Path(directory).resolve(), Path(path).resolve()
    return target.relative_to(root).as_posix() if target.is_relative_to(root) else None
