"""Bad recipes fail at load time with one line naming file, line and key."""

from __future__ import annotations

import json

import pytest

from aot.errors import RecipeError
from aot.recipe import load_recipe, recipe_json_schema_text
from tests.conftest import TINY_BERT


def test_tiny_recipe_loads_with_defaults(write_recipe):
    loaded = load_recipe(write_recipe())
    assert loaded.name == "tiny"
    assert [p.name for p in loaded.passes] == ["merge_linears"]
    assert loaded.recipe.trace.frontend == "fx"
    assert loaded.recipe.export.onnx.opset == 18


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("  seed: 0\n", "  seed: 0\n  sed: 1\n"), r"tiny.yaml:11: model.sed: unknown key"),
        (lambda t: t.replace("seed: 0", "seed: zero"), r"tiny.yaml:10: model.seed: Input should be a valid integer"),
        (lambda t: t.replace("  - merge_linears", "  - merge_lineras"), r"tiny.yaml:19: passes\[0\]: unknown pass 'merge_lineras'"),
        (lambda t: t.replace("    batch: {size: 2", "    batch: {size: -2"), r"tiny.yaml:13: inputs.dims.batch.size"),
        (lambda t: t.replace("passes:\n  - merge_linears", "passes:\n  - merge_linears: {bogus: 1}"), r"tiny.yaml:19: passes\[0\].merge_linears.bogus: unknown key"),
        (lambda t: t + "validate: {}\n", r"tiny.yaml:\d+: validate: duplicate key"),
        (lambda t: t.replace("  class: BertModel\n", "  class: BertModel\n  pretrained: somewhere\n"), r"tiny.yaml:\d+: model: give exactly one"),
        (lambda t: t.replace("shape: [batch, sequence]}", "shape: [batch, seq]}", 1), r"tiny.yaml:\d+: inputs: input 'input_ids' uses dim 'seq'"),
    ],
    ids=["unknown-key", "wrong-type", "unknown-pass", "bad-range", "unknown-pass-option", "duplicate-key", "two-sources", "unknown-dim"],
)
def test_bad_recipe_names_file_line_and_key(write_recipe, edit, expected):
    text = edit(TINY_BERT)
    assert text != TINY_BERT, "the edit must change the recipe"
    with pytest.raises(RecipeError, match=expected) as caught:
        load_recipe(write_recipe(text))
    assert "\n" not in str(caught.value)


def test_malformed_yaml_names_line(write_recipe):
    with pytest.raises(RecipeError, match=r"tiny.yaml:3: malformed YAML"):
        load_recipe(write_recipe("model:\n  config: {model_type: bert\n  seed: [\n"))


def test_missing_pretrained_directory(write_recipe):
    with pytest.raises(RecipeError, match=r"tiny.yaml:2: model.pretrained: pretrained directory not found"):
        load_recipe(write_recipe("model:\n  pretrained: no/such/dir\n"))


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "absent.yaml")


def test_pass_on_unsupported_frontend_is_rejected_at_load(write_recipe):
    from aot.passes import registry

    fx_only = [info.name for info in registry.all_passes() if "export" not in info.frontends]
    if not fx_only:
        pytest.skip("every registered pass runs on both frontends")
    text = TINY_BERT.replace("  - merge_linears", f"  - {fx_only[0]}") + "trace: {frontend: export}\n"
    with pytest.raises(RecipeError, match="cannot run on the 'export' frontend"):
        load_recipe(write_recipe(text))


def test_published_schema_is_current():
    from pathlib import Path

    published = Path(__file__).parents[1] / "aot" / "schema" / "recipe.schema.json"
    assert published.read_text() == recipe_json_schema_text(), "run `aot schema > aot/schema/recipe.schema.json`"
    schema = json.loads(published.read_text())
    assert schema["additionalProperties"] is False
    assert "model" in schema["required"]


def test_the_cuda_recipe_loads_and_says_what_it_needs_where_torch_has_no_gpu():
    from pathlib import Path

    import torch

    from aot.models import load_model

    path = Path(__file__).parents[1] / "recipes" / "bert_cuda.yaml"
    loaded = load_recipe(path)
    onnx_options = loaded.recipe.export.onnx
    assert (onnx_options.target, onnx_options.precision, onnx_options.float16) == ("cuda", "auto", True)
    assert loaded.recipe.validate_.float16.atol == 2e-2
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the shipped-recipe tests build this recipe")
    with pytest.raises(RecipeError, match=r"bert_cuda.yaml:\d+: model.device: 'cuda' is asked for, but this machine's torch sees no CUDA device"):
        load_model(loaded)


def test_precision_auto_follows_the_target(write_recipe):
    cpu = load_recipe(write_recipe()).recipe.export.onnx
    assert (cpu.target, cpu.float16) == ("cpu", False)
    forced = load_recipe(write_recipe(TINY_BERT + "export:\n  onnx: {precision: float16}\n")).recipe.export.onnx
    assert forced.float16
    cuda32 = load_recipe(write_recipe(TINY_BERT + "export:\n  onnx: {target: cuda, precision: float32}\n")).recipe.export.onnx
    assert not cuda32.float16
