"""Opening a build directory, the one way every command does: files first, then consent, then the recipe and plan.

    opened = open_build(directory, expect_sha256, trust_code)  # every file against the manifest (exit 7)
    opened.require_consent("aot validate")                       # before any of its code runs (exit 7)
    plan = opened.plan(recipe_path)                               # the recipe it was built from, its hash checked

``aot validate``, ``aot bench``, ``aot run`` and ``aot.load`` all start here; nothing from the directory is
imported or run before its hash matched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aot.directory.consent import require_consent
from aot.directory.integrity import IntegrityReport, verify_directory
from aot.directory.manifest import MANIFEST_NAME
from aot.errors import IntegrityError, RecipeError
from aot.recipe.load import LoadedRecipe, load_recipe, recipe_sha256
from aot.recipe.reader import read_recipe_text
from aot.recipe.plan import BuildPlan, plan_build


@dataclass
class OpenedBuild:
    """A build directory whose files matched its manifest."""

    directory: Path
    integrity: IntegrityReport
    expect_sha256: str | None = None
    trust_code: bool = False

    @property
    def manifest(self) -> dict[str, Any]:
        return self.integrity.manifest

    def sha256_of(self, relative: str) -> str | None:
        """The manifest's digest of a file of the directory (None: not listed)."""
        return self.integrity.sha256_of(relative)

    def require_consent(self, command: str) -> str:
        """Why the directory's code may run here for ``command`` (aot.directory.consent); exit 7 when nothing says so."""
        return require_consent(self.directory, self.integrity.manifest_sha256, self.expect_sha256, self.trust_code, command)

    def recipe(self, recipe_path: str | Path | None = None) -> LoadedRecipe:
        return recipe_of_build(self.directory, self.manifest, recipe_path)

    def plan(self, recipe_path: str | Path | None = None) -> BuildPlan:
        """The plan of the recipe the directory was built from (or of ``recipe_path``, whose hash must match)."""
        return plan_build(self.recipe(recipe_path))


def open_build(directory: str | Path, expect_sha256: str | None = None, trust_code: bool = False) -> OpenedBuild:
    """``directory`` checked file by file against its manifest (and the manifest against ``expect_sha256``)."""
    return OpenedBuild(Path(directory), verify_directory(directory, expect_sha256), expect_sha256, trust_code)


def recipe_of_build(directory: Path, manifest: dict[str, Any], recipe_path: str | Path | None = None) -> LoadedRecipe:
    """The recipe a checked build directory was built from (see :func:`validate_directory`): ``recipe_path`` when
    given, whose hash must match; else the file at the path the manifest records, when it still holds that recipe
    (its relative paths then resolve as at the build); else the build's own copy."""
    recorded = manifest["recipe"]
    named = Path(str(recorded.get("path", "")))
    if recipe_path:
        source, copy = Path(recipe_path), False
        if not source.is_file():
            raise RecipeError(f"{source}: recipe not found")
    else:
        # The recorded path is as the build was given it, relative to where the build ran: from elsewhere it may name
        # another file, and a recipe edited since is not the one built. The copy, checked with the rest, is.
        copy = not _holds_recipe(named, recorded["sha256"])
        source = directory / "recipe.yaml" if copy else named
    try:
        loaded = load_recipe(source, overrides=recorded.get("overrides", ()))  # the --set the build was given
    except RecipeError as error:
        if not copy:
            raise
        # The copy's relative paths (model.pretrained, the gate's data) now start from the build directory.
        why = "is another file" if named.is_file() else "is not there"
        raise RecipeError(f"{error} (the build's copy of its recipe, read since {named} {why} "
                          "from here: pass --recipe with the recipe itself)") from None
    if loaded.sha256 != recorded["sha256"]:
        raise IntegrityError(f"{source}: recipe changed since the build (sha256 differs from {MANIFEST_NAME})")
    return loaded


def _holds_recipe(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a file whose recipe text has the recorded digest."""
    if not path.is_file():
        return False
    try:
        return recipe_sha256(read_recipe_text(path)) == sha256
    except RecipeError:  # unreadable, too large, not UTF-8: not the recipe that was built
        return False
