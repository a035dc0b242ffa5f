"""An entry: what one key built, as a small JSON document (Bazel's action cache beside its CAS).

::

    {"format": 1, "key": "<64 hex>", "name": "tiny", "created": "2026-11-28T17:40:00Z",
     "manifest_sha256": "<64 hex>",
     "files": {"manifest.json": {"sha256": "<64 hex>", "bytes": 15362},
               "model.onnx.data": {"sha256": "<64 hex>", "bytes": 437933056,
                                   "chunk_bytes": 16777216, "chunks": ["<64 hex>", ... 27 of them]}, ...},
     "report": {... the build's report, as aot build --json prints it ...},
     "inputs": {... the key's document: what was hashed, to tell why two builds missed each other ...}}

Every file of the build directory is a blob named by its sha256, or, when it is larger than a chunk, the
blobs of its chunks in order (:mod:`aot.cache.chunks`). Read back, an entry is checked before any of
its paths is used: a path must stay inside the directory it is restored into, and a digest must be 64 hex
digits (it names a blob in the store), and a file's chunks must cover exactly its bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

from aot.cache.chunks import chunk_count, chunk_span
from aot.cache.errors import CorruptEntry
from aot.directory.manifest import MANIFEST_NAME

ENTRY_FORMAT = 2  # 2: chunks
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class StoredFile:
    sha256: str  # the file's; its blob's name when it has no chunks
    bytes: int
    chunks: tuple[str, ...] = ()  # the blobs of its chunks, in order; none: one blob
    chunk_bytes: int = 0  # each chunk's size (the last is shorter)

    @property
    def blobs(self) -> dict[str, int]:
        """``{blob name: its size}`` of what holds this file in the store."""
        if not self.chunks:
            return {self.sha256: self.bytes}
        return {digest: chunk_span(index, self.bytes, self.chunk_bytes)[1] for index, digest in enumerate(self.chunks)}

    def to_json(self) -> dict[str, Any]:
        described: dict[str, Any] = {"sha256": self.sha256, "bytes": self.bytes}
        if self.chunks:
            described.update(chunk_bytes=self.chunk_bytes, chunks=list(self.chunks))
        return described


@dataclass(frozen=True)
class CacheEntry:
    key: str
    name: str  # the recipe's name, for aot cache ls
    created: datetime  # UTC
    manifest_sha256: str
    files: dict[str, StoredFile]  # {path relative to the build directory: its blob}
    report: dict[str, Any] = field(repr=False)
    inputs: dict[str, Any] = field(repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(stored.bytes for stored in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ENTRY_FORMAT,
            "key": self.key,
            "name": self.name,
            "created": self.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "manifest_sha256": self.manifest_sha256,
            "files": {relative: stored.to_json() for relative, stored in sorted(self.files.items())},
            "report": self.report,
            "inputs": self.inputs,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=False).encode("utf-8") + b"\n"


def parse_entry(data: bytes, where: str, key: str | None = None) -> CacheEntry:
    """The entry in ``data`` (read from ``where``), or CorruptEntry naming ``where`` and what is wrong."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise CorruptEntry(f"{where}: not valid JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != ENTRY_FORMAT:
        raise CorruptEntry(f"{where}: not an aot cache entry of format {ENTRY_FORMAT}")
    try:
        entry = CacheEntry(
            key=_digest(document["key"], "key"),
            name=str(document["name"]),
            created=datetime.strptime(document["created"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc),
            manifest_sha256=_digest(document["manifest_sha256"], "manifest_sha256"),
            files={_relative(relative): _stored(value, relative) for relative, value in document["files"].items()},
            report=dict(document["report"]),
            inputs=dict(document["inputs"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptEntry(f"{where}: {error}") from None
    if key is not None and entry.key != key:
        raise CorruptEntry(f"{where}: holds key {entry.key}, not {key}")
    if MANIFEST_NAME not in entry.files:
        raise CorruptEntry(f"{where}: lists no {MANIFEST_NAME}")
    return entry


def _digest(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise ValueError(f"{what} is not a sha256 of 64 hex digits")
    return value


def _relative(relative: str) -> str:
    """A path that stays inside the directory it is restored into (an entry is data from elsewhere)."""
    path = PurePosixPath(relative)
    if not relative or path.is_absolute() or ".." in path.parts or "\\" in relative or path.as_posix() != relative:
        raise ValueError(f"file path '{relative}' would leave the build directory")
    return relative


def _stored(value: Any, relative: str) -> StoredFile:
    size = value["bytes"]
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"files['{relative}'] has no byte count")
    digest = _digest(value["sha256"], f"files['{relative}'].sha256")
    if "chunks" not in value:
        return StoredFile(digest, size)
    chunk_bytes, chunks = value["chunk_bytes"], value["chunks"]
    if not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or not isinstance(chunks, list) or len(chunks) != chunk_count(size, chunk_bytes):
        raise ValueError(f"files['{relative}']: its chunks do not cover its {size} bytes")
    return StoredFile(digest, size, tuple(_digest(chunk, f"files['{relative}'].chunks") for chunk in chunks), chunk_bytes)
