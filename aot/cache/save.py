"""A miss: the build directory just written, stored as blobs and then its entry.

What is stored is proved with aot's own check (:func:`aot.directory.integrity.verify_directory`): every file
listed in the manifest and as hashed, nothing else; the entry lists exactly those files, by the digests the
manifest records, so a restore checks the same bytes the build validated. A file larger than the store's chunk
size is stored as its chunks (:mod:`aot.cache.chunks`), and is held to the manifest by the digest of those same
reads, so each byte is read once: its chunks are sent before the check, and a directory that then fails it leaves
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
from aot.directory.manifest import MANIFEST_NAME, read_manifest


def save_build(store: CacheStore, key: BuildKey, directory: Path, name: str, report: dict[str, Any]) -> CacheEntry:
    """Store ``directory`` (a build's, just verified) under ``key``; its blobs first, its entry last."""
    chunked = {relative: _put_chunks(store, directory / relative) for relative in _large_files(directory, store.chunk_bytes)}
    integrity = verify_directory(directory, hashed={relative: file_sha256 for relative, (_, file_sha256) in chunked.items()})
    recorded = {relative: (described["sha256"], described["bytes"]) for relative, described in integrity.manifest["artifacts"].items()}
    recorded[MANIFEST_NAME] = (integrity.manifest_sha256, (directory / MANIFEST_NAME).stat().st_size)
    files = {}
    for relative, (sha256, size) in sorted(recorded.items()):
        if relative in chunked:
            files[relative] = StoredFile(sha256, size, chunked[relative][0], store.chunk_bytes)
        else:
            files[relative] = StoredFile(sha256, size)
            if not store.has_blob(sha256, size):
                store.put_blob(directory / relative, sha256)
    entry = CacheEntry(key=key.digest, name=name, created=datetime.now(timezone.utc).replace(microsecond=0),
                       manifest_sha256=integrity.manifest_sha256, files=files, report=report, inputs=key.document)
    store.write_entry(entry)
    return entry


def _large_files(directory: Path, chunk_bytes: int) -> list[str]:
    """The files the manifest lists at more than ``chunk_bytes`` that are there (verify_directory judges the rest)."""
    try:
        listed = read_manifest(directory)["artifacts"]
        return sorted(relative for relative, described in listed.items()
                      if described["bytes"] > chunk_bytes and (directory / relative).is_file() and not (directory / relative).is_symlink()
                      and (directory / relative).resolve().is_relative_to(directory.resolve()))
    except (OSError, ValueError, KeyError, TypeError):
        return []  # not a manifest this can read: verify_directory says what is wrong with it


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
