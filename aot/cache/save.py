"""A miss: the build directory just written, stored as blobs and then its entry.

What is stored is proved first with aot's own check (:func:`aot.directory.integrity.verify_directory`): every
file listed in the manifest and as hashed, nothing else; the entry lists exactly those files, by the digests the
manifest records, so a restore checks the same bytes the build validated. A blob already in the store at its
size is not sent again (another build, or another key, made the same file).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aot.cache.entry import CacheEntry, StoredFile
from aot.cache.key import BuildKey
from aot.cache.store import CacheStore
from aot.directory.integrity import verify_directory
from aot.directory.manifest import MANIFEST_NAME


def save_build(store: CacheStore, key: BuildKey, directory: Path, name: str, report: dict[str, Any]) -> CacheEntry:
    """Store ``directory`` (a build's, just verified) under ``key``; its blobs first, its entry last."""
    integrity = verify_directory(directory)
    files = {relative: StoredFile(recorded["sha256"], recorded["bytes"]) for relative, recorded in integrity.manifest["artifacts"].items()}
    files[MANIFEST_NAME] = StoredFile(integrity.manifest_sha256, (directory / MANIFEST_NAME).stat().st_size)
    for relative, stored in sorted(files.items()):
        if not store.has_blob(stored):
            store.put_blob(directory / relative, stored)
    entry = CacheEntry(key=key.digest, name=name, created=datetime.now(timezone.utc).replace(microsecond=0),
                       manifest_sha256=integrity.manifest_sha256, files=files, report=report, inputs=key.document)
    store.write_entry(entry)
    return entry
