"""Opening a build directory: the recipe it was built from, checked against its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aot.directory.manifest import MANIFEST_NAME
from aot.errors import IntegrityError, RecipeError
from aot.recipe.load import LoadedRecipe, load_recipe


def recipe_of_build(directory: Path, manifest: dict[str, Any], recipe_path: str | Path | None = None) -> LoadedRecipe:
    """The recipe a checked build directory was built from (see :func:`validate_directory`)."""
    recorded = manifest["recipe"]
    source = Path(recipe_path) if recipe_path else Path(str(recorded.get("path", "")))
    copy = not recipe_path and not source.is_file()
    if copy:
        source = directory / "recipe.yaml"  # the copy the build kept; its hash was checked with the rest
    if not source.is_file():
        raise RecipeError(f"{source}: recipe not found; pass --recipe")
    try:
        loaded = load_recipe(source)
    except RecipeError as error:
        if not copy:
            raise
        # The copy's relative paths (model.pretrained, the gate's data) now start from the build directory.
        raise RecipeError(f"{error} (the build's copy of its recipe, read since {recorded.get('path')} is not there "
                          "from here: pass --recipe with the recipe itself)") from None
    if loaded.sha256 != recorded["sha256"]:
        raise IntegrityError(f"{source}: recipe changed since the build (sha256 differs from {MANIFEST_NAME})")
    return loaded
