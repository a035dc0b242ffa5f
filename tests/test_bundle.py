"""The image processor a vision build ships: written from the recipe, checked at build and by aot validate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import rehash_manifest

pytestmark = pytest.mark.artifact

RESNET = (Path(__file__).parents[1] / "recipes" / "resnet.yaml").read_text()


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "resnet.yaml"
    path.write_text(text)
    return path


def test_a_processor_whose_pixels_the_build_cannot_take_fails_validation(tmp_path, cli):
    assert "size: {shortest_edge: 64}" in RESNET, "the precondition: the shipped recipe crops to its 64x64 input"
    result = cli("build", _recipe(tmp_path, RESNET.replace("size: {shortest_edge: 64}", "size: {shortest_edge: 48}")), "-o", tmp_path / "out")
    assert result.exit_code == 5, result.described
    assert ("resnet.yaml:13: model.image_processor: the shipped image processor gives pixel_values of shape [1, 3, 48, 48], "
            "but the build takes ['batch', 3, 64, 64] (axis 2: 48)") in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_processor_setting_that_names_no_type_is_a_recipe_error(tmp_path, cli):
    text = RESNET.replace("    image_processor_type: ConvNextImageProcessor\n", "")
    assert text != RESNET
    result = cli("build", _recipe(tmp_path, text), "-o", tmp_path / "out")
    assert result.exit_code == 2 and "model.image_processor" in result.stderr and "image_processor_type" in result.stderr, result.described
    unknown = RESNET.replace("ConvNextImageProcessor", "NoSuchImageProcessor")
    result = cli("build", _recipe(tmp_path, unknown), "-o", tmp_path / "out")
    assert result.exit_code == 2 and "model.image_processor" in result.stderr, result.described
    assert not (tmp_path / "out").exists()


def test_validate_checks_the_shipped_processor(tmp_path, cli):
    built = cli("build", _recipe(tmp_path, RESNET), "-o", tmp_path / "out")
    assert built.exit_code == 0, built.described
    directory = Path(shutil.copytree(tmp_path / "out", tmp_path / "copy"))
    assert cli("validate", directory).exit_code == 0, "the precondition: the build validates as shipped"
    settings = json.loads((directory / "preprocessor_config.json").read_text())
    settings["crop_size"] = settings["size"] = {"shortest_edge": 80}
    (directory / "preprocessor_config.json").write_text(json.dumps(settings))
    assert cli("validate", directory).exit_code == 7, "changed, not re-hashed: an integrity failure"
    rehash_manifest(directory, "preprocessor_config.json")
    result = cli("validate", directory, "--trust-code")
    assert result.exit_code == 5 and "pixel_values of shape [1, 3, 80, 80]" in result.stderr, result.described
