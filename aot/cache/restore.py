"""A hit: an entry's blobs fetched into a staging directory, proved, then swapped into place as a build's are.

The proof is aot's own: :func:`aot.directory.integrity.verify_directory` against the restored manifest, whose
sha256 must be the one the entry records, so every file is the size and sha256 the manifest lists and nothing
else is there; and each blob is the file the manifest lists under its path. A blob whose bytes are not its name
is removed from the store (it can never serve anyone) and the entry is refused: a corrupted blob never yields a
wrong output, only a build.

The target is replaced by :func:`aot.directory.outdir.staged_directory`, the code a build uses: the same
refusal of a directory aot did not write, the same atomic swap. A restored directory is not recorded as built
here (:mod:`aot.directory.consent`): a cache is data from elsewhere, and a hit is no consent to run its code.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from aot.cache.chunks import read_chunks
from aot.cache.entry import CacheEntry
from aot.cache.errors import CorruptEntry
from aot.cache.store import CacheStore
from aot.directory.integrity import verify_directory
from aot.directory.manifest import MANIFEST_NAME, sha256_file
from aot.directory.outdir import staged_directory
from aot.errors import AotError, first_line


def restore_entry(store: CacheStore, entry: CacheEntry, target: Path) -> int:
    """``entry``'s build directory at ``target``; the number of files. CorruptEntry leaves ``target`` as it was."""
    where = store.entry_url(entry.key)
    if entry.files[MANIFEST_NAME].sha256 != entry.manifest_sha256:
        raise CorruptEntry(f"{where}: its {MANIFEST_NAME} blob is not the manifest it records ({entry.manifest_sha256})")
    with staged_directory(target) as staging:
        store.fetch(entry.files, staging, where)
        _verify(store, entry, staging, where)
    return len(entry.files)


def _verify(store: CacheStore, entry: CacheEntry, staging: Path, where: str) -> None:
    try:
        integrity = verify_directory(staging, expect_sha256=entry.manifest_sha256)
    except AotError as error:
        wrong = _blobs_not_their_name(entry, staging)
        if wrong:
            store.forget_blobs(sorted({digest for digest, _ in wrong}))
            named = ", ".join(f"{digest} ({what})" for digest, what in wrong)
            raise CorruptEntry(f"{where}: blob {named} does not hold the bytes its name says (removed from the store)") from None
        message = first_line(error).replace(f"{staging.resolve()}/", "").replace(f"{staging}/", "")
        raise CorruptEntry(f"{where}: its files disagree with its {MANIFEST_NAME}: {message}") from None
    for relative, stored in entry.files.items():
        recorded = integrity.sha256_of(relative) if relative != MANIFEST_NAME else stored.sha256
        if recorded != stored.sha256:
            raise CorruptEntry(f"{where}: records {stored.sha256} for {relative}, whose {MANIFEST_NAME} records {recorded}")


def _blobs_not_their_name(entry: CacheEntry, staging: Path) -> list[tuple[str, str]]:
    """``(blob, what it held)`` for each blob whose restored bytes are not its name: a file's, or a chunk's, read back
    from where it was written (only once a file failed its check: a hit hashes each byte once)."""
    wrong = []
    for relative, stored in sorted(entry.files.items()):
        path = staging / relative
        if not stored.chunks:
            if not path.is_file() or sha256_file(path) != stored.sha256:
                wrong.append((stored.sha256, relative))
            continue
        found = (digest for digest, _ in read_chunks(path, stored.chunk_bytes))
        for index, (digest, held) in enumerate(itertools.zip_longest(stored.chunks, found)):
            if digest is not None and held != digest:  # a file cut short leaves its last chunks unheld
                wrong.append((digest, f"chunk {index} of {relative}"))
    return wrong
