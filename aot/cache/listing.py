"""``aot cache ls``: the entries of a store, newest first, an unreadable one included (prune removes it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aot.cache.entry import CacheEntry, parse_entry
from aot.cache.errors import CorruptEntry
from aot.cache.store import CacheStore


@dataclass(frozen=True)
class ListedEntry:
    key: str
    created: datetime  # the entry's own date; an unreadable entry's file date
    entry: CacheEntry | None  # None: unreadable
    problem: str | None = None  # why it is unreadable

    @property
    def name(self) -> str:
        return self.entry.name if self.entry is not None else "?"

    @property
    def bytes(self) -> int:
        return self.entry.total_bytes if self.entry is not None else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "created": self.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "bytes": self.bytes,
            "files": len(self.entry.files) if self.entry is not None else 0,
            "manifest_sha256": self.entry.manifest_sha256 if self.entry is not None else None,
            "problem": self.problem,
        }


def list_entries(store: CacheStore) -> list[ListedEntry]:
    listed = []
    for key in store.entry_keys():
        try:
            entry = parse_entry(store.entry_data(key), store.entry_url(key), key)
            listed.append(ListedEntry(key, entry.created, entry))
        except CorruptEntry as error:
            listed.append(ListedEntry(key, store.modified(store.entry_path(key)), None, str(error)))
    return sorted(listed, key=lambda item: (item.created, item.key), reverse=True)
