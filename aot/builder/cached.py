"""``aot build --cache URL``: the key, a lookup, then a restore on a hit, or the build and its store on a miss.

The cache only ever saves a build. A store that cannot be reached, read or written, and an entry that cannot be
used (unreadable, a blob missing or corrupt, files that disagree with its manifest) are each one warning line,
and the build runs as without the cache; a miss then overwrites the entry. What a build refuses is refused
before the cache is asked: a target that is not new, empty or an earlier aot build (exit 2, nothing touched).

A hit is not a build on this machine: its directory is not recorded as built here
(:mod:`aot.directory.consent`), so its code runs only with the consent a directory from elsewhere needs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aot.builder.report import BuildReport
from aot.builder.spine import build, default_output
from aot.builder.stages import Progress, Stages
from aot.cache.entry import CacheEntry
from aot.cache.errors import CacheUnavailable, CorruptEntry
from aot.cache.key import BuildKey, build_key
from aot.cache.restore import restore_entry
from aot.cache.save import save_build
from aot.cache.store import CacheStore, check_cache_url
from aot.directory.outdir import check_replaceable
from aot.errors import AotError
from aot.recipe.load import LoadedRecipe, load_recipe
from aot.recipe.plan import plan_build

log = logging.getLogger(__name__)

__all__ = ["CacheOutcome", "CachedBuild", "build_with_cache"]


@dataclass
class CacheOutcome:
    url: str
    available: bool = False  # the store was opened, read and (on a miss) written
    key: str | None = None
    hit: bool = False
    stored: bool = False
    files: int = 0  # restored on a hit, stored on a miss
    problem: str | None = None  # the warning logged: why the store or an entry was not used
    seconds: dict[str, float] = field(default_factory=dict)  # cache_lookup, cache_restore, cache_store

    def to_json(self) -> dict[str, Any]:
        return {"hit": self.hit, "key": self.key, "url": self.url, "available": self.available, "stored": self.stored,
                "files": self.files, "problem": self.problem, "seconds": self.seconds}


@dataclass
class CachedBuild:
    output: str
    manifest_sha256: str
    report_json: dict[str, Any]  # as aot build --json prints it, with its "cache" section
    cache: CacheOutcome
    report: BuildReport | None = None  # the build's own; None on a hit, where nothing was built


def build_with_cache(
    recipe: str | Path | LoadedRecipe,
    output: str | Path | None = None,
    progress: Progress | None = None,
    *,
    cache: str | Path,
    cache_options: Mapping[str, Any] | None = None,
) -> CachedBuild:
    """:func:`aot.builder.spine.build`, with the cache at ``cache`` (a directory or an fsspec URL; ``cache_options``
    go to fsspec) restoring a build of the same key instead, or storing this one."""
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    plan = plan_build(loaded)
    target = Path(output) if output is not None else default_output(plan)
    check_replaceable(target)  # before the cache is asked: refused exactly as a build refuses it
    check_cache_url(cache)
    stages, outcome = Stages(progress), CacheOutcome(url=str(cache))
    store, key, entry = None, None, None
    with stages("cache_lookup"):
        try:
            store = CacheStore.open(cache, cache_options)
            outcome.available = True
            key = build_key(plan)
            outcome.key = key.digest
            entry = store.read_entry(key.digest)
        except CacheUnavailable as error:
            _unavailable(outcome, error)
            store = None
        except CorruptEntry as error:
            _not_used(outcome, f"build cache entry refused ({error}); building")
    if entry is not None:
        with stages("cache_restore"):
            try:
                outcome.files = restore_entry(store, entry, target)
                outcome.hit = True
            except CorruptEntry as error:
                _not_used(outcome, f"build cache entry refused ({error}); building")
            except CacheUnavailable as error:
                _unavailable(outcome, error)
                store = None  # not asked again in this build
        if outcome.hit:
            outcome.seconds = stages.seconds
            return _restored(entry, target, outcome)
    report = build(loaded, target, progress=progress)
    if store is not None:
        with stages("cache_store"):
            _store(store, key, target, report, outcome)
    outcome.seconds = stages.seconds
    return CachedBuild(report.output, report.manifest_sha256, {**report.to_json(), "cache": outcome.to_json()}, outcome, report)


def _store(store: CacheStore, key: BuildKey, target: Path, report: BuildReport, outcome: CacheOutcome) -> None:
    try:
        entry = save_build(store, key, target, report.name, report.to_json())
    except CacheUnavailable as error:
        outcome.available = False
        _not_used(outcome, f"build not stored in the cache ({error})")
        return
    except AotError as error:  # the directory changed after the build: it stands, but is not what was validated
        _not_used(outcome, f"build not stored in the cache ({error})")
        return
    outcome.stored, outcome.files = True, len(entry.files)


def _restored(entry: CacheEntry, target: Path, outcome: CacheOutcome) -> CachedBuild:
    report = {**entry.report, "output": str(target), "cache": outcome.to_json()}
    return CachedBuild(str(target), entry.manifest_sha256, report, outcome)


def _unavailable(outcome: CacheOutcome, error: CacheUnavailable) -> None:
    outcome.available = False
    _not_used(outcome, f"build cache not used ({error}); building without it")


def _not_used(outcome: CacheOutcome, message: str) -> None:
    """One warning line (the CLI shows it on stderr); the build goes on."""
    outcome.problem = " ".join(message.split())
    log.warning("%s", outcome.problem)
