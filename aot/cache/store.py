"""The store: blobs by content and entries by key, on any fsspec filesystem (a directory, ``memory://``, ``s3://``).

::

    URL/blobs/ab/ab12…(64 hex)      a build directory's file, or a chunk of a large one, named by the sha256 of its bytes
    URL/entries/<64 hex key>.json   what one key built (:mod:`aot.cache.entry`)

A build writes its blobs first and its entry last, so a reader finds an entry only once every blob it names is
there. Object stores (S3, GCS, Azure, memory) publish an object whole when its upload ends; on a filesystem
(a directory, SFTP...) a file is written under a temporary name beside its place and renamed, so no reader sees
half of one. A reader still checks every byte (:mod:`aot.cache.restore`).

Options reach fsspec as they are (``url_to_fs(url, **options)``): ``endpoint_url``, ``anon``, ``client_kwargs``
for s3fs, say. fsspec's own ``FSSPEC_S3_ENDPOINT_URL``-style variables and botocore's ``AWS_ENDPOINT_URL``,
``AWS_PROFILE``... apply too.

Every call into fsspec goes through :meth:`CacheStore._reaching`: a backend raises what it raises (botocore's
``EndpointConnectionError`` is no ``OSError``), and any of it means the same to a build: build without the cache.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from aot.cache.chunks import CHUNK_BYTES, CHUNK_WINDOW, chunk_span
from aot.cache.entry import CacheEntry, StoredFile, parse_entry
from aot.cache.errors import CacheUnavailable, CorruptEntry
from aot.errors import RecipeError, first_line

log = logging.getLogger(__name__)

BLOBS = "blobs"
ENTRIES = "entries"
_ENTRY_SUFFIX = ".json"
# Where an upload appears whole or not at all; elsewhere a temporary name and a rename do it.
_WHOLE_OBJECT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"})


def storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``["endpoint_url=http://127.0.0.1:9000", "anon=true"]`` (``--cache-option``) -> fsspec options; values are YAML."""
    options: dict[str, Any] = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        if not equals or not name.strip():
            raise RecipeError(f"--cache-option {pair}: not KEY=VALUE")
        try:
            options[name.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise RecipeError(f"--cache-option {pair}: the value is not YAML ({first_line(error)})") from None
    return options


_BARE_PROTOCOL = re.compile(r"[a-z][a-z0-9+.-]*")  # a chain's wrapper named alone: "simplecache" in simplecache::s3://b


def check_cache_url(url: str | Path) -> None:
    """RecipeError (exit 2) when a link of ``url`` (each of a chained ``a::b://``, read as fsspec reads it) names a
    protocol fsspec has no filesystem for: a typing mistake no retry mends. A known protocol whose backend is not
    installed, like a store that cannot be reached, stays a warning (:class:`CacheUnavailable`), and the build goes
    on without the cache."""
    import fsspec
    from fsspec.core import split_protocol

    links = str(url).split("::")
    for position, link in enumerate(links):
        protocol, _ = split_protocol(link)
        if protocol is None and position < len(links) - 1 and _BARE_PROTOCOL.fullmatch(link):
            protocol = link
        if protocol is None:
            continue
        try:
            fsspec.get_filesystem_class(protocol)  # its registry: also a protocol registered at run time
        except ValueError:
            raise RecipeError(f"--cache {url}: unknown protocol {protocol!r}, none that fsspec knows") from None
        except ImportError:
            continue


class CacheStore:
    """One cache, at ``url``; :meth:`open` it."""

    def __init__(self, fs: Any, root: str, url: str, chunk_bytes: int = CHUNK_BYTES):
        self.fs, self.root, self.url = fs, root.rstrip("/"), url
        self.chunk_bytes = chunk_bytes  # a larger file is stored as chunks of this size
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        self._whole_objects = bool(protocols & _WHOLE_OBJECT_PROTOCOLS)

    @classmethod
    def open(cls, url: str | Path, options: Mapping[str, Any] | None = None, chunk_bytes: int = CHUNK_BYTES, *,
             create: bool = True) -> CacheStore:
        """The store at ``url``, created where it is missing (unless ``create`` is false: ``aot cache ls``/``prune``
        read a cache, and a mistyped path must not become one); CacheUnavailable when it cannot be reached or made,
        or is no cache."""
        import fsspec

        url = str(url)
        try:
            fs, root = fsspec.core.url_to_fs(url, **dict(options or {}))
        except Exception as error:  # an unknown protocol (ValueError), a backend not installed (ImportError), bad options
            raise CacheUnavailable(f"{url}: {type(error).__name__}: {first_line(error)}") from None
        store = cls(fs, root, url, chunk_bytes)
        with store._reaching("cannot open the cache"):  # also the first request: an unreachable store says so here
            if fs.isfile(store.root):
                raise CacheUnavailable(f"{url}: a file, not a build cache directory")
            if create:
                fs.makedirs(store.root, exist_ok=True)
            else:
                store._require_cache()
        return store

    def _require_cache(self) -> None:
        """The root holds a cache: a directory with its ``entries``/``blobs``, or nothing yet. On an object store a
        prefix exists only while objects lie under it: one with none is an empty cache (a build stored nothing yet, or
        a prune removed all), not a typo. Listing, not ``exists``, asks the store: s3fs's ``exists`` of a bucket
        answers False for an unreachable endpoint."""
        try:
            held = {path.rstrip("/") for path in self.fs.ls(self.root, detail=False)}
        except (FileNotFoundError, NotADirectoryError):  # nothing there, or a file where a parent folder would be
            if self._whole_objects:
                return
            raise CacheUnavailable(f"{self.url}: no build cache there (nothing at that path)") from None
        cache_parts = {f"{self.root}/{ENTRIES}", f"{self.root}/{BLOBS}"}
        if held and not held & cache_parts:
            raise CacheUnavailable(f"{self.url}: holds no build cache (no {ENTRIES}/ or {BLOBS}/ in it)")

    # -- paths

    def blob_path(self, digest: str) -> str:
        return f"{self.root}/{BLOBS}/{digest[:2]}/{digest}"

    def entry_path(self, key: str) -> str:
        return f"{self.root}/{ENTRIES}/{key}{_ENTRY_SUFFIX}"

    def entry_url(self, key: str) -> str:
        """The entry as the user would name it: under the URL they gave."""
        return f"{self.url.rstrip('/')}/{ENTRIES}/{key}{_ENTRY_SUFFIX}"

    # -- entries

    def read_entry(self, key: str) -> CacheEntry | None:
        """The entry of ``key``; None when there is none; CorruptEntry when it cannot be used."""
        with self._reaching(f"cannot read {self.entry_url(key)}"):
            try:
                data = self.fs.cat_file(self.entry_path(key))
            except FileNotFoundError:
                return None
        return parse_entry(data, self.entry_url(key), key)

    def write_entry(self, entry: CacheEntry) -> None:
        data = entry.to_bytes()
        with self._reaching(f"cannot write {self.entry_url(entry.key)}"):
            self._publish(self.entry_path(entry.key), lambda path: self.fs.pipe_file(path, data))

    def remove_entry(self, key: str) -> None:
        with self._reaching(f"cannot remove {self.entry_url(key)}"):
            self.fs.rm_file(self.entry_path(key))

    def entry_keys(self) -> list[str]:
        """Every key with an entry (temporary files of entries being written left out)."""
        with self._reaching("cannot list the entries"):
            try:
                names = [Path(path).name for path in self.fs.ls(f"{self.root}/{ENTRIES}", detail=False)]
            except FileNotFoundError:
                return []
        return sorted(name[: -len(_ENTRY_SUFFIX)] for name in names if name.endswith(_ENTRY_SUFFIX))

    def entry_data(self, key: str) -> bytes:
        with self._reaching(f"cannot read {self.entry_url(key)}"):
            return self.fs.cat_file(self.entry_path(key))

    # -- blobs

    def has_blob(self, digest: str, size: int) -> bool:
        """Whether blob ``digest`` is there at ``size`` bytes (its bytes are checked by whoever restores it)."""
        with self._reaching("cannot look up a blob"):
            try:
                return self.fs.size(self.blob_path(digest)) == size
            except FileNotFoundError:
                return False

    def put_blob(self, local: Path, digest: str) -> None:
        """The file ``local`` as blob ``digest``."""
        with self._reaching(f"cannot write blob {digest}"):
            self._publish(self.blob_path(digest), lambda path: self.fs.put_file(str(local), path))

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """``{digest: bytes}`` as blobs; in one call where uploads appear whole (s3fs sends them concurrently)."""
        with self._reaching(f"cannot write blob {next(iter(blobs), '')}"):
            if self._whole_objects:
                self.fs.pipe({self.blob_path(digest): data for digest, data in blobs.items()})
                return
            for digest, data in blobs.items():
                self._publish(self.blob_path(digest), lambda path, data=data: self.fs.pipe_file(path, data))

    def fetch(self, files: Mapping[str, StoredFile], into: Path, where: str) -> None:
        """Each file of ``files`` to ``into / relative``, from its blob or its chunks' blobs.

        CorruptEntry names ``where`` and the blob that is missing, or the chunk that is not its size (removed from
        the store). The bytes are left to the caller's check of each file against its digest, which finds a wrong
        chunk without hashing every chunk a second time (:func:`aot.cache.restore.restore_entry`).
        """
        for relative in files:
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
        whole = sorted(relative for relative, stored in files.items() if not stored.chunks)
        with self._reaching("cannot fetch the blobs"):
            try:
                # One call: fsspec fetches them concurrently where the backend can (s3fs does).
                self.fs.get([self.blob_path(files[r].sha256) for r in whole], [str(into / r) for r in whole])
            except FileNotFoundError:
                missing = [f"{files[r].sha256} ({r})" for r in whole if not self.fs.exists(self.blob_path(files[r].sha256))]
                raise CorruptEntry(f"{where}: blob {', '.join(missing) or 'of a file'} missing from the store") from None
            chunked = {relative: stored for relative, stored in files.items() if stored.chunks}
            self._fetch_chunks(chunked, into, where)

    def _fetch_chunks(self, files: Mapping[str, StoredFile], into: Path, where: str) -> None:
        """Every chunk of ``files``, a window of them at a time, each checked for its size and written in place.

        A thread writes one window while the next is fetched: writing is page-cache allocation, fetching is the
        network (or another disk), and each releases the GIL. At most two windows are held.
        """
        pieces = [(relative, index, digest) for relative, stored in sorted(files.items()) for index, digest in enumerate(stored.chunks)]
        descriptors: dict[str, int] = {}
        writing: Future | None = None
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-cache-write") as writer:
                for relative, stored in sorted(files.items()):
                    descriptors[relative] = os.open(into / relative, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.ftruncate(descriptors[relative], stored.bytes)
                for start in range(0, len(pieces), CHUNK_WINDOW):
                    window = pieces[start : start + CHUNK_WINDOW]
                    fetched = self.fs.cat(sorted({self.blob_path(digest) for _, _, digest in window}), on_error="return")
                    writes = []
                    for relative, index, digest in window:
                        stored = files[relative]
                        offset, length = chunk_span(index, stored.bytes, stored.chunk_bytes)
                        data = fetched.get(self.blob_path(digest))
                        if isinstance(data, FileNotFoundError) or data is None:
                            raise CorruptEntry(f"{where}: blob {digest} (chunk {index} of {relative}) missing from the store")
                        if isinstance(data, BaseException):
                            raise data
                        if len(data) != length:
                            self.forget_blobs([digest])
                            raise CorruptEntry(f"{where}: blob {digest} (chunk {index} of {relative}) does not hold the "
                                               "bytes its name says (removed from the store)")
                        writes.append((descriptors[relative], data, offset))
                    if writing is not None:
                        writing.result()  # the window before is written (or its error raised) before another is queued
                    writing = writer.submit(_write_at, writes)
                if writing is not None:
                    writing.result()
        finally:
            for descriptor in descriptors.values():
                os.close(descriptor)

    def forget_blobs(self, digests: list[str]) -> None:
        """Remove blobs that are not their name, best effort: one left there is still refused to every reader."""
        for digest in digests:
            try:
                self.remove_blob(digest)
            except CacheUnavailable as error:  # the store went away: the corrupt blob is what to report
                log.debug("could not remove blob %s: %s", digest, error)

    def remove_blob(self, digest: str) -> None:
        with self._reaching(f"cannot remove blob {digest}"):
            self.fs.rm_file(self.blob_path(digest))

    def blob_files(self) -> list[str]:
        """Every file under blobs/ (digests, and any temporary file a writer left), as store paths."""
        with self._reaching("cannot list the blobs"):
            try:
                return sorted(self.fs.find(f"{self.root}/{BLOBS}"))
            except FileNotFoundError:
                return []

    def remove_path(self, path: str) -> None:
        with self._reaching(f"cannot remove {path}"):
            self.fs.rm_file(path)

    def modified(self, path: str) -> datetime:
        with self._reaching(f"cannot read the date of {path}"):
            when = self.fs.modified(path)
        return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)

    # -- how

    def _publish(self, path: str, write: Any) -> None:
        """``write(name)`` so that ``path`` appears whole (see the module docstring)."""
        if self._whole_objects:
            write(path)
            return
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            write(temporary)
            self.fs.mv(temporary, path)
        except BaseException:
            try:
                self.fs.rm_file(temporary)
            except Exception:  # already gone, or the store went away: the first error is the one to report
                pass
            raise

    @contextmanager
    def _reaching(self, what: str) -> Iterator[None]:
        try:
            yield
        except (CorruptEntry, CacheUnavailable):
            raise
        except Exception as error:  # whatever the backend raises (see the module docstring)
            log.debug("%s: %s", self.url, what, exc_info=True)
            raise CacheUnavailable(f"{self.url}: {what}: {type(error).__name__}: {first_line(error)}") from None


def _write_at(writes: list[tuple[int, bytes, int]]) -> None:
    """``(descriptor, data, offset)``: each written whole at its offset."""
    for descriptor, data, offset in writes:
        view = memoryview(data)
        while view:
            view = view[os.pwrite(descriptor, view, offset + len(data) - len(view)) :]
