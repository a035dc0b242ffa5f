"""What ``aot.builder.build`` hands back: a report about the directory in place, and where a build goes by default."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from aot.builder import build, default_output
from aot.directory.outdir import _TEMP_MARK
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build


def test_default_output_takes_a_path_a_loaded_recipe_or_its_plan(write_recipe):
    path = write_recipe()
    loaded = load_recipe(path)
    assert loaded.recipe.output is None  # precondition: the recipe names no output of its own
    assert default_output(path) == default_output(loaded) == default_output(plan_build(loaded)) == Path("out") / "tiny"
    named = load_recipe(path, overrides=["output=elsewhere/x"])
    assert default_output(named) == default_output(plan_build(named)) != Path("out") / "tiny"


@pytest.mark.artifact
def test_the_report_names_no_file_of_the_staging_directory(write_recipe, tmp_path):
    report = build(write_recipe(), tmp_path / "out")
    assert Path(report.output, "manifest.json").is_file()  # precondition: the build is in place
    held = repr([getattr(report, field.name) for field in dataclasses.fields(report)])
    assert str(tmp_path / "out") in held and _TEMP_MARK not in held, "a path into the staging directory, gone after the swap"
