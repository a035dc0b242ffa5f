"""The manifest: what was built, from what, with which tools, and proof of the bytes."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
TOOLS = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "aot")


def tool_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe_files(root: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {sha256, bytes}}`` for every file under ``root`` except the manifest."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative != MANIFEST_NAME:
            files[relative] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return files


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = root / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


def read_manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / MANIFEST_NAME).read_text())
