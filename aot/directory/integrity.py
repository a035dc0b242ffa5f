"""Check a build directory against its manifest before anything in it is run.

``aot validate`` and ``aot bench`` import ``graph_module/module.py`` and load the recipe the
directory names; both are code. So before either runs, every file must be what the manifest
says: listed, inside the directory, a regular file (no symlink), of the recorded size and
sha256, and no file may be there that the manifest does not list (but for a signature and provenance at the one
name each that ``aot sign`` may write inside it: :mod:`aot.release.paths`).

A manifest can be re-hashed by whoever can write the directory. What proves a directory from
elsewhere is the manifest's own sha256, published by whoever built it:
``--expect-sha256`` checks it (``aot build`` prints it). It covers every file, since the
manifest lists each one's sha256.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from aot.directory.manifest import MANIFEST_NAME, sha256_file
from aot.errors import IntegrityError, RecipeError
from aot.release.paths import RELEASE_FILE_NAMES

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def expected_sha256(value: str | None) -> str | None:
    """A published manifest digest as the checks compare it (stripped, lower case); RecipeError (exit 2) unless it is
    64 hexadecimal digits: a malformed digest is a mistake on the command line, not a directory that fails its proof."""
    if value is None:
        return None
    digest = value.strip().lower()
    if not _SHA256_HEX.fullmatch(digest):
        raise RecipeError(f"expected sha256 {value!r} is not 64 hexadecimal digits")
    return digest


@dataclass
class IntegrityReport:
    directory: Path
    manifest_sha256: str
    manifest: dict[str, Any] = field(repr=False)

    @property
    def files_checked(self) -> int:
        return len(self.manifest["artifacts"])

    def sha256_of(self, relative: str) -> str | None:
        """The recorded sha256 of ``relative``; None when the build has no such file."""
        listed = self.manifest["artifacts"].get(relative)
        return listed["sha256"] if listed else None


def verify_directory(directory: str | Path, expect_sha256: str | None = None, *,
                     digest: Callable[[str, Path], str | None] | None = None) -> IntegrityReport:
    """Raise IntegrityError (exit 7) unless ``directory`` holds exactly the files its manifest lists.

    ``digest(relative, path)``: called for each listed file once its place, kind and size have passed, for the sha256
    of its bytes as the caller reads them for a purpose of its own (model-signing's hashing of every file, the cache
    sending a large one as chunks), so that no file is read twice; None leaves the reading to this check. The file is
    held to the manifest by that digest; every other check is the same.
    """
    expect_sha256 = expected_sha256(expect_sha256)
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    if not directory.is_dir() or not manifest_path.is_file() or manifest_path.is_symlink():
        raise RecipeError(f"{directory}: not an aot build directory (no {MANIFEST_NAME})")
    data = manifest_path.read_bytes()
    manifest_sha256 = hashlib.sha256(data).hexdigest()
    if expect_sha256 is not None and manifest_sha256 != expect_sha256:
        raise IntegrityError(f"{manifest_path}: sha256 is {manifest_sha256}, not the expected {expect_sha256}")
    manifest = _parse(manifest_path, data)
    root = directory.resolve()
    for relative, recorded in manifest["artifacts"].items():
        _check_file(root, relative, recorded, manifest_path, digest)
    listed = set(manifest["artifacts"]) | {MANIFEST_NAME}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        # A signature or provenance kept inside (aot sign) is not the build's: tolerated at its one name, top level, a
        # regular file; it proves itself (aot verify).
        release_file = relative in RELEASE_FILE_NAMES and path.is_file()
        if path.is_symlink() or (not path.is_dir() and relative not in listed and not release_file):
            raise IntegrityError(f"{path}: not listed in {MANIFEST_NAME} (a build directory holds only what it lists)")
    return IntegrityReport(directory=directory, manifest_sha256=manifest_sha256, manifest=manifest)


def _parse(manifest_path: Path, data: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise IntegrityError(f"{manifest_path}: not valid JSON ({error})") from None
    artifacts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    recipe = manifest.get("recipe") if isinstance(manifest, dict) else None
    if not isinstance(artifacts, dict) or not isinstance(recipe, dict) or not isinstance(recipe.get("sha256"), str):
        raise IntegrityError(f"{manifest_path}: not an aot manifest (no `artifacts` mapping or `recipe.sha256`)")
    for relative, recorded in artifacts.items():
        if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str) or not isinstance(recorded.get("bytes"), int):
            raise IntegrityError(f"{manifest_path}: artifacts['{relative}'] has no sha256 and byte count")
    return manifest


def _check_file(root: Path, relative: str, recorded: dict[str, Any], manifest_path: Path,
                digest: Callable[[str, Path], str | None] | None) -> None:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise IntegrityError(f"{manifest_path}: artifact path '{relative}' points outside {root}")
    path = root / relative
    if path.is_symlink() or not path.resolve().is_relative_to(root):
        raise IntegrityError(f"{path}: a link; {MANIFEST_NAME} may list only regular files inside {root}")
    if not path.is_file():
        raise IntegrityError(f"{path}: listed in {MANIFEST_NAME} but missing")
    if path.stat().st_size != recorded["bytes"]:
        raise IntegrityError(f"{path}: {path.stat().st_size} bytes, {MANIFEST_NAME} says {recorded['bytes']} (modified after the build)")
    if ((digest and digest(relative, path)) or sha256_file(path)) != recorded["sha256"]:
        raise IntegrityError(f"{path}: sha256 differs from {MANIFEST_NAME} (the file was modified after the build)")
