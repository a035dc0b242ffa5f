"""The manifest: what was built, from what, with which tools, and proof of the bytes."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

TOOLS = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "aot")


def tool_versions() -> dict[str, str | None]:
    """Python's, the tools' (:data:`TOOLS`) and then every other declared dependency's version, by name."""
    from aot.compat.window import declared_requirements, installed_version

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in TOOLS:
        versions[name] = installed_version(name)
    for name in sorted(requirement.name for requirement in declared_requirements()):
        versions.setdefault(name, installed_version(name))
    return versions


def cpu_model() -> str:
    """The CPU's name as the kernel reports it (every figure is quoted with it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    bytes: int
    mtime_ns: int


def hash_files(root: Path, earlier: dict[str, FileDigest] | None = None) -> dict[str, FileDigest]:
    """The digest of every file under ``root`` except the manifest, by relative path.

    ``earlier``: an earlier answer for the same ``root``. A file it lists with the same size and
    modification time is not read again (the build hashes the GraphModule artifact while the
    ONNX export runs, and only the ONNX files after).
    """
    earlier = earlier or {}
    digests = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative == MANIFEST_NAME:
            continue
        status = path.stat()
        known = earlier.get(relative)
        if known is not None and (known.bytes, known.mtime_ns) == (status.st_size, status.st_mtime_ns):
            digests[relative] = known
        else:
            digests[relative] = FileDigest(sha256_file(path), status.st_size, status.st_mtime_ns)
    return digests


def describe_files(root: Path, earlier: dict[str, FileDigest] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {sha256, bytes}}`` for every file under ``root`` except the manifest."""
    return {relative: {"sha256": d.sha256, "bytes": d.bytes} for relative, d in hash_files(root, earlier).items()}


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = root / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


def read_manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / MANIFEST_NAME).read_text())
