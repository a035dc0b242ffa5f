"""A miss: the build directory just written, stored as blobs and then its entry.

What is stored is proved with aot's own check (:func:`aot.directory.integrity.verify_directory`): every file
listed in the manifest and as hashed, nothing else; the entry lists exactly those files, by the digests the
manifest records, so a restore checks the same bytes the build validated. A file larger than the store's chunk
size is stored as its chunks (:mod:`aot.cache.chunks`), sent as the check reads it and held to the manifest by the
digest of those same reads, so each byte is read once: a directory that fails the check after some were sent leaves
only blobs no entry names (``aot cache prune`` removes them), never an entry. A blob already in the store at its
size is not sent again (another build, or another key, made the same file or chunk).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aot.cache.chunks import CHUNK_WINDOW, read_chunks
from aot.cache.entry import CacheEntry, StoredFile
from aot.cache.key import BuildKey
from aot.cache.store import CacheStore
from aot.directory.integrity import verify_directory
from aot.directory.manifest import MANIFEST_NAME


def save_build(store: CacheStore, key: BuildKey, directory: Path, name: str, report: dict[str, Any]) -> CacheEntry:
    """Store ``directory`` (a build's, just verified) under ``key``; its blobs first, its entry last."""
    chunked: dict[str, tuple[str, ...]] = {}

    def send_in_chunks(relative: str, path: Path) -> str | None:
        """A large file's chunks sent as the check reads it; its sha256 from those reads (None: a file stored whole)."""
        if path.stat().st_size <= store.chunk_bytes:
            return None
        chunked[relative], sha256 = _put_chunks(store, path)
        return sha256

    integrity = verify_directory(directory, digest=send_in_chunks)
    recorded = {relative: (described["sha256"], described["bytes"]) for relative, described in integrity.manifest["artifacts"].items()}
    recorded[MANIFEST_NAME] = (integrity.manifest_sha256, (directory / MANIFEST_NAME).stat().st_size)
    files = {}
    for relative, (sha256, size) in sorted(recorded.items()):
        if relative in chunked:
            files[relative] = StoredFile(sha256, size, chunked[relative], store.chunk_bytes)
        else:
            files[relative] = StoredFile(sha256, size)
            if not store.has_blob(sha256, size):
                store.put_blob(directory / relative, sha256)
    entry = CacheEntry(key=key.digest, name=name, created=datetime.now(timezone.utc).replace(microsecond=0),
                       manifest_sha256=integrity.manifest_sha256, files=files, report=report, inputs=key.document)
    store.write_entry(entry)
    return entry


def _put_chunks(store: CacheStore, path: Path) -> tuple[tuple[str, ...], str]:
    """The chunks of ``path`` that the store lacks, sent a window at a time; the digests of all of them, in order, and
    the whole file's sha256, from the same reads."""
    digests: list[str] = []
    whole = hashlib.sha256()
    pending: dict[str, bytes] = {}
    for digest, data in read_chunks(path, store.chunk_bytes):
        digests.append(digest)
        whole.update(data)
        if digest not in pending and not store.has_blob(digest, len(data)):
            pending[digest] = data
        if len(pending) == CHUNK_WINDOW:
            store.put_blobs(pending)
            pending = {}
    if pending:
        store.put_blobs(pending)
    return tuple(digests), whole.hexdigest()
