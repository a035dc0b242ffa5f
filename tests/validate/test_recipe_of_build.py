"""The recipe a build directory was built from, when the recipe file has moved: the copy, and --recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from tests.conftest import PRETRAINED

pytestmark = pytest.mark.artifact


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> tuple[Path, Path]:
    """A build of a recipe whose checkpoint path is relative, after the recipe file moved away: (build, moved recipe)."""
    from aot.builder import build

    root = tmp_path_factory.mktemp("moved-recipe")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128)
    transformers.BertModel(config).save_pretrained(root / "pretrained")
    recipe = root / "tiny.yaml"
    recipe.write_text(PRETRAINED)
    output = Path(build(recipe, root / "builds" / "out").output)
    moved = root / "renamed.yaml"
    recipe.rename(moved)
    return output, moved


def test_the_copy_of_a_moved_recipe_names_the_missing_checkpoint_and_asks_for_the_recipe(cli, moved):
    build, _ = moved
    assert not Path(json.loads((build / "manifest.json").read_text())["recipe"]["path"]).exists()  # precondition
    result = cli("validate", build)
    assert result.exit_code == 2, result.described
    line = result.stderr.strip().splitlines()[-1]
    assert "recipe.yaml:2: model.pretrained: pretrained directory not found" in line and "pass --recipe" in line, line


def test_validate_and_bench_rebuild_the_eager_model_from_the_recipe_given(cli, moved):
    build, recipe = moved
    result = cli("validate", build, "--recipe", recipe)
    assert result.exit_code == 0, result.described
    result = cli("bench", build, "--recipe", recipe, "--runs", "1", "--warmup", "1", "--gap-ms", "0", "--in-process", "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert {runner["runner"] for shape in report["shapes"] for runner in shape["runners"]} >= {"eager", "graph_module", "onnx"}
