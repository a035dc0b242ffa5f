"""Why the cache was not used. Neither is an :class:`aot.errors.AotError`: the cache only ever saves a build, so
the builder logs these in one line and builds (``aot cache ls``/``prune`` turn them into exit codes)."""

from __future__ import annotations


class CacheUnavailable(Exception):
    """The store could not be opened, read or written (a refused connection, a path that cannot be created)."""


class CorruptEntry(Exception):
    """An entry that must not be restored: unreadable, a blob missing or not the bytes its digest names, or files
    that disagree with the manifest it holds. The message names the entry and the blob."""
