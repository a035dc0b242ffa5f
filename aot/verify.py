"""``aot validate DIR``: re-check a build's bytes against its manifest and its numerics against eager."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aot.errors import IntegrityError, RecipeError, ValidationError
from aot.build import eager_outputs, validate_artifacts
from aot.inputs import shape_cases
from aot.manifest import MANIFEST_NAME, read_manifest, sha256_file
from aot.models import load_model
from aot.recipe import load_recipe
from aot.validate import Comparison


@dataclass
class VerifyReport:
    directory: str
    files_checked: int = 0
    validation: list[Comparison] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "files_checked": self.files_checked,
            "validation": [c.to_json() for c in self.validation],
        }


def check_hashes(directory: Path, manifest: dict[str, Any]) -> int:
    for relative, expected in manifest["artifacts"].items():
        path = directory / relative
        if not path.is_file():
            raise IntegrityError(f"{path}: listed in {MANIFEST_NAME} but missing")
        if sha256_file(path) != expected["sha256"]:
            raise IntegrityError(f"{path}: sha256 differs from {MANIFEST_NAME} (the file was modified after the build)")
    return len(manifest["artifacts"])


def verify(directory: str | Path, recipe_path: str | Path | None = None) -> VerifyReport:
    directory = Path(directory)
    if not (directory / MANIFEST_NAME).is_file():
        raise RecipeError(f"{directory}: not an aot build directory (no {MANIFEST_NAME})")
    manifest = read_manifest(directory)
    report = VerifyReport(directory=str(directory))
    report.files_checked = check_hashes(directory, manifest)

    source = Path(recipe_path) if recipe_path else Path(manifest["recipe"]["path"])
    if not recipe_path and not source.is_file():
        source = directory / "recipe.yaml"  # the copy the build kept; its hash is checked above
    if not source.is_file():
        raise RecipeError(f"{source}: recipe not found; pass --recipe")
    loaded = load_recipe(source)
    if loaded.sha256 != manifest["recipe"]["sha256"]:
        raise IntegrityError(f"{source}: recipe changed since the build (sha256 differs from {MANIFEST_NAME})")
    model = load_model(loaded)
    cases = shape_cases(loaded, model)
    expected = [eager_outputs(model, case.inputs) for case in cases]
    report.validation = validate_artifacts(loaded, cases, expected, directory)
    failed = [c for c in report.validation if not c.ok]
    if failed:
        raise ValidationError(failed[0].summary())
    return report
