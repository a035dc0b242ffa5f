"""``aot cache prune``: entries removed by age or count, then every blob no remaining entry names.

An unreadable entry is always removed: it can never be a hit. An unreferenced blob younger than ``blob_grace``
is kept, since a build stores its blobs before its entry and may be doing so now. A build that reuses an old
blob while a prune removes it leaves an entry that a reader refuses (a missing blob) and rebuilds: never a wrong
output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import PurePosixPath
from typing import Any

from aot.cache.listing import list_entries
from aot.cache.store import CacheStore


@dataclass
class PruneReport:
    entries_removed: list[str] = field(default_factory=list)  # keys
    entries_kept: int = 0
    blobs_removed: int = 0
    blobs_kept: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"entries_removed": self.entries_removed, "entries_kept": self.entries_kept,
                "blobs_removed": self.blobs_removed, "blobs_kept": self.blobs_kept}


def prune(store: CacheStore, older_than: timedelta | None = None, keep: int | None = None,
          blob_grace: timedelta = timedelta(hours=1), now: datetime | None = None) -> PruneReport:
    """Remove the entries older than ``older_than`` or past the ``keep`` newest, then the blobs none of the rest names."""
    now = now or datetime.now(timezone.utc)
    report = PruneReport()
    readable_rank = 0
    referenced: set[str] = set()
    for listed in list_entries(store):  # newest first
        expired = listed.entry is None
        if listed.entry is not None:
            readable_rank += 1
            expired = (older_than is not None and now - listed.created > older_than) or (keep is not None and readable_rank > keep)
        if expired:
            store.remove_entry(listed.key)
            report.entries_removed.append(listed.key)
        else:
            report.entries_kept += 1
            referenced.update(digest for stored in listed.entry.files.values() for digest in stored.blobs)
    for path in store.blob_files():
        if PurePosixPath(path).name in referenced or now - store.modified(path) <= blob_grace:
            report.blobs_kept += 1
        else:
            store.remove_path(path)
            report.blobs_removed += 1
    return report
