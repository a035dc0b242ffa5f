"""Release files are written whole or not at all, and replace only a release file.

A signature or a provenance file is written under a temporary name beside its target and renamed over it only
once every file of the command is complete: a key that fails, a full disk or Ctrl-C leaves the earlier files as
they were and no half-written one. And, as ``aot build`` replaces only an earlier build, ``aot sign`` replaces only
an earlier signature (an OMS bundle) or provenance (a DSSE envelope): ``--signature recipe.yaml`` is refused.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aot.errors import RecipeError

OMS_BUNDLE_MEDIA_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"


def is_oms_signature(data: dict[str, Any]) -> bool:
    """A Sigstore bundle, the container an OMS signature is."""
    return str(data.get("mediaType", "")).startswith(OMS_BUNDLE_MEDIA_TYPE_PREFIX)


def is_dsse_envelope(data: dict[str, Any]) -> bool:
    return isinstance(data.get("payloadType"), str) and isinstance(data.get("signatures"), list)


def check_writable(path: Path, what: str, is_earlier: Callable[[dict[str, Any]], bool]) -> None:
    """RecipeError (exit 2) unless ``path`` may become a ``what``: new under an existing directory, or an earlier one."""
    if path.is_symlink() or path.is_dir():
        raise RecipeError(f"{path}: is a {'link' if path.is_symlink() else 'directory'}; give a file path for the {what}")
    if not path.parent.is_dir():
        raise RecipeError(f"{path}: cannot write the {what}: {path.parent} is not a directory")
    if path.exists() and not is_earlier(_json_object(path)):
        raise RecipeError(f"{path}: exists and is not a {what}; refusing to replace it")


def _json_object(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8").strip()
        data = json.loads(text.splitlines()[0] if text else "null")
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def written_whole(*targets: Path) -> Iterator[tuple[Path, ...]]:
    """Temporary paths (not yet created) beside ``targets``; each is renamed over its target when the block ends
    without error, and removed otherwise."""
    temporaries = tuple(target.with_name(f".{target.name}.{secrets.token_hex(6)}.partial") for target in targets)
    try:
        yield temporaries
        for temporary, target in zip(temporaries, targets):
            os.replace(temporary, target)
    finally:
        for temporary in temporaries:
            temporary.unlink(missing_ok=True)
