"""The tested window of aot's dependencies, as its installed metadata declares it (pyproject's ``dependencies``).

``aot build`` records every dependency's version in the manifest and warns in one line when one lies
outside the window it was tested on: the build may still work (the canary says what is known), but
the same-bytes promise holds only inside it.
"""

from __future__ import annotations

import importlib.metadata
import logging

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

log = logging.getLogger(__name__)


def declared_requirements() -> list[Requirement]:
    """aot's own requirements without extras (``[test]``, ``[chart]``); empty when aot runs from a bare checkout."""
    try:
        declared = importlib.metadata.requires("aot") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    requirements = [Requirement(text) for text in declared]
    return [requirement for requirement in requirements if requirement.marker is None or "extra" not in str(requirement.marker)]


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_distributions() -> dict[str, str]:
    """``{normalised name: version}`` of every installed distribution; the first of a name on sys.path wins, as for
    imports (the build cache's key and the provenance's dependencies both name them)."""
    versions: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            versions.setdefault(canonicalize_name(name), distribution.version)
    return dict(sorted(versions.items()))


def outside_window() -> list[str]:
    """``name version (tested: specifier)`` for each installed dependency outside its window (local labels ignored)."""
    found = []
    for requirement in declared_requirements():
        version = installed_version(requirement.name)
        if version is None or not requirement.specifier:
            continue
        try:
            public = Version(version).public
        except InvalidVersion:
            continue
        if not requirement.specifier.contains(public, prereleases=True):
            found.append(f"{requirement.name} {version} (tested: {requirement.specifier})")
    return found


def warn_outside_window() -> list[str]:
    """Logs one warning line naming every dependency outside the tested window; returns them."""
    found = outside_window()
    if found:
        log.warning("outside aot's tested window: %s; the build may differ (docs/compatibility.md)", ", ".join(found))
    return found
