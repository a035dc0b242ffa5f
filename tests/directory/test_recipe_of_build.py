"""Which recipe a build directory is checked against when no --recipe is given: the file at the path its manifest
records only while that file is the recipe built; else the build's own copy, wherever the command runs from."""

from __future__ import annotations

import pytest

from aot.directory.open import recipe_of_build
from aot.errors import IntegrityError
from aot.recipe.load import load_recipe
from tests.conftest import TINY_BERT


@pytest.fixture
def build(tmp_path):
    """A build directory's recipe copy and the manifest section recording it at a path relative to the build's cwd."""
    directory = tmp_path / "out"
    directory.mkdir()
    (directory / "recipe.yaml").write_text(TINY_BERT)
    recorded = {"path": "recipes/tiny.yaml", "sha256": load_recipe(directory / "recipe.yaml").sha256, "overrides": []}
    return directory, {"recipe": recorded}


def _elsewhere(tmp_path, monkeypatch, text: str | None):
    """Run from a directory whose recipes/tiny.yaml holds ``text`` (None: no such file)."""
    cwd = tmp_path / "elsewhere"
    (cwd / "recipes").mkdir(parents=True)
    if text is not None:
        (cwd / "recipes" / "tiny.yaml").write_text(text)
    monkeypatch.chdir(cwd)
    return cwd / "recipes" / "tiny.yaml"


def test_the_recorded_path_is_used_while_it_holds_the_recipe_built(build, tmp_path, monkeypatch):
    directory, manifest = build
    named = _elsewhere(tmp_path, monkeypatch, TINY_BERT)
    assert recipe_of_build(directory, manifest).path.resolve() == named.resolve()


@pytest.mark.parametrize("text", [None, TINY_BERT.replace("seed: 0", "seed: 1"), "not: [a recipe"])
def test_another_file_or_none_at_the_recorded_path_falls_back_to_the_builds_copy(build, tmp_path, monkeypatch, text):
    directory, manifest = build
    named = _elsewhere(tmp_path, monkeypatch, text)
    assert text is None or named.read_text() != TINY_BERT  # precondition: the path names another file, or none
    loaded = recipe_of_build(directory, manifest)
    assert loaded.path == directory / "recipe.yaml" and loaded.sha256 == manifest["recipe"]["sha256"]


def test_a_recipe_given_must_be_the_one_built(build, tmp_path, monkeypatch):
    directory, manifest = build
    other = _elsewhere(tmp_path, monkeypatch, TINY_BERT.replace("seed: 0", "seed: 1"))
    with pytest.raises(IntegrityError, match="recipe changed since the build"):
        recipe_of_build(directory, manifest, other)
