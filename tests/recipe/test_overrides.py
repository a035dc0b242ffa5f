"""``--set KEY=VALUE``: recipe keys overridden on the command line, applied before validation, recorded by the build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from aot.errors import RecipeError
from aot.builder.check import check_recipe
from aot.recipe.load import load_recipe
from aot.recipe.overrides import apply_overrides, parse_override
from aot.recipe.plan import plan_build
from tests.conftest import TINY_BERT

BERT = Path(__file__).parents[2] / "recipes" / "bert.yaml"


def test_an_int_override_reaches_the_validated_recipe():
    assert load_recipe(BERT).recipe.model.config["num_hidden_layers"] != 2  # precondition: the file says otherwise
    loaded = load_recipe(BERT, overrides=["model.config.num_hidden_layers=2"])
    config = loaded.recipe.model.config
    assert config["num_hidden_layers"] == 2 and isinstance(config["num_hidden_layers"], int)
    assert config["hidden_size"] == 768, "the rest of the mapping is the file's"
    assert loaded.overrides == ("model.config.num_hidden_layers=2",)
    assert loaded.resolved()["model"]["config"]["num_hidden_layers"] == 2


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("2", 2), ("true", True), ("false", False), ("[a, b]", ["a", "b"]), ("bfloat16", "bfloat16"), ("'2'", "2"),
     ("1.0e-4", 1.0e-4), ("{size: 4, dynamic: true}", {"size": 4, "dynamic": True}), ("", None), ("a=b", "a=b")],
    ids=["int", "true", "false", "list", "string", "quoted-int", "float", "mapping", "empty-is-null", "equals-in-value"],
)
def test_the_value_is_read_as_yaml(value, parsed):
    override = parse_override(f"model.dtype={value}")
    assert override.location == ("model", "dtype")
    assert override.value == parsed and type(override.value) is type(parsed)


def test_bool_list_and_string_overrides_are_validated(write_recipe):
    loaded = load_recipe(write_recipe(), overrides=[
        "export.onnx.enabled=false", "passes=[merge_linears, remove_dropout]", "model.dtype=bfloat16",
    ])
    assert loaded.recipe.export.onnx.enabled is False
    assert [spec.name for spec in loaded.passes] == ["merge_linears", "remove_dropout"]
    assert loaded.recipe.model.dtype == "bfloat16"


def test_a_later_override_wins(write_recipe):
    loaded = load_recipe(write_recipe(), overrides=["model.seed=1", "model.seed=7"])
    assert loaded.recipe.model.seed == 7


def test_absent_mappings_are_created(write_recipe):
    assert "export:" not in TINY_BERT and "trace:" not in TINY_BERT  # precondition
    loaded = load_recipe(write_recipe(), overrides=["export.onnx.opset=17", "trace.frontend=fx"])
    assert loaded.recipe.export.onnx.opset == 17
    data, origins = apply_overrides({"model": {"pretrained": "x"}}, ["model.config.num_hidden_layers=2"])
    assert data == {"model": {"pretrained": "x", "config": {"num_hidden_layers": 2}}}
    assert origins == {("model", "config"): "model.config.num_hidden_layers=2",
                       ("model", "config", "num_hidden_layers"): "model.config.num_hidden_layers=2"}


def test_a_key_left_empty_in_the_file_takes_a_mapping(write_recipe):
    loaded = load_recipe(write_recipe(TINY_BERT + "export:\n"), overrides=["export.onnx.opset=17"])
    assert loaded.recipe.export.onnx.opset == 17


def test_an_alias_shared_with_another_key_is_not_changed_there():
    shared = {"size": 2, "dynamic": True}
    data = {"inputs": {"dims": {"batch": shared, "sequence": shared}}}
    changed, _ = apply_overrides(data, ["inputs.dims.batch.size=4"])
    assert changed["inputs"]["dims"]["batch"]["size"] == 4
    assert changed["inputs"]["dims"]["sequence"]["size"] == 2
    assert shared == {"size": 2, "dynamic": True} and data["inputs"]["dims"]["batch"] is shared, "the input is not changed"


def test_the_recipe_file_is_untouched(write_recipe):
    path = write_recipe()
    before = path.read_bytes()
    loaded = load_recipe(path, overrides=["model.config.num_hidden_layers=1", "export.onnx.opset=17"])
    assert path.read_bytes() == before
    assert loaded.text == before.decode() and loaded.sha256 == hashlib.sha256(before).hexdigest()
    assert load_recipe(path).recipe.model.config["num_hidden_layers"] == 2


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trace.nope=1", r"^--set trace.nope: unknown key"),
        ("model.confg.x=1", r"^--set model.confg: unknown key \(did you mean 'config'\?\)$"),
        ("model.seed=zero", r"^--set model.seed: Input should be a valid integer"),
        ("passes=[merge_lineras]", r"^--set passes\[0\]: unknown pass 'merge_lineras'"),
        ("export.onnx={opset: 99}", r"^--set export.onnx.opset: "),
    ],
    ids=["unknown-key", "unknown-key-in-created-mapping", "wrong-type", "unknown-pass", "inside-a-mapping-value"],
)
def test_an_error_in_an_override_says_set_and_names_the_key(write_recipe, override, expected):
    with pytest.raises(RecipeError, match=expected) as caught:
        load_recipe(write_recipe(), overrides=[override])
    assert "tiny.yaml" not in str(caught.value), "an override has no line in the file"
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_an_error_found_after_validation_in_an_override_says_set(write_recipe):
    with pytest.raises(RecipeError, match=r"^--set model.config.num_hiden_layers: unknown BertConfig key"):
        check_recipe(write_recipe(), overrides=["model.config.num_hiden_layers=1"])


def test_an_error_in_the_files_mapping_names_the_override_that_changed_it(write_recipe):
    with pytest.raises(RecipeError, match=r"^.*tiny.yaml:1: model: give exactly one.*\(with --set model.pretrained=there\)$"):
        load_recipe(write_recipe(), overrides=["model.pretrained=there"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.seed", "--set model.seed: not KEY=VALUE"),
        ("=1", "--set =1: empty key"),
        ("model..seed=1", "--set model..seed=1: empty part in key"),
        ("model.class.x=1", "--set model.class.x=1: model.class is 'BertModel' (a str), not a mapping"),
        ("passes.merge_linears=1", "--set passes.merge_linears=1: passes is a list, not a mapping"),
        ("passes[0]=x", "--set passes[0]=x: list items are not set one by one"),
        ("model.seed=[1,", "--set model.seed=[1,: malformed YAML value"),
    ],
    ids=["no-equals", "empty-key", "empty-part", "into-a-scalar", "into-a-list", "list-index", "malformed-value"],
)
def test_a_malformed_override_is_one_line_naming_it(write_recipe, override, expected):
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(), overrides=[override])
    assert str(caught.value).startswith(expected), str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_one_string_is_not_taken_for_a_list_of_overrides(write_recipe):
    assert load_recipe(write_recipe(), overrides=["model.seed=1"]).recipe.model.seed == 1  # precondition: a list is taken
    with pytest.raises(TypeError, match="not one string"):
        load_recipe(write_recipe(), overrides="model.seed=1")
    with pytest.raises(TypeError, match=r"not a mapping: \['model.seed=1'\]\?"):  # iterated, it would give its keys
        load_recipe(write_recipe(), overrides={"model.seed": 1})


def test_the_manifest_section_records_the_overrides_and_the_effective_recipe(write_recipe):
    path = write_recipe()
    plain = plan_build(load_recipe(path)).recipe.to_manifest()
    # No overrides: exactly the section builds wrote before --set existed (their manifests keep their bytes).
    assert list(plain) == ["path", "sha256", "resolved"]
    overridden = plan_build(load_recipe(path, overrides=["model.config.num_hidden_layers=1"])).recipe.to_manifest()
    assert overridden["overrides"] == ["model.config.num_hidden_layers=1"]
    assert overridden["resolved"]["model"]["config"]["num_hidden_layers"] == 1
    assert overridden["sha256"] == plain["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_check_takes_set(cli, write_recipe):
    result = cli("check", write_recipe(), "--set", "model.config.num_hidden_layers=1", "--set", "export.onnx.opset=17")
    assert result.exit_code == 0, result.described
    result = cli("check", write_recipe(), "--set", "trace.nope=1")
    assert result.exit_code == 2, result.described
    assert result.stderr.strip() == "aot: error: --set trace.nope: unknown key", result.described


@pytest.mark.parametrize(
    ("override", "message"),
    [("trace.nope=1", "--set trace.nope: unknown key"), ("model.seed", "--set model.seed: not KEY=VALUE")],
    ids=["unknown-key", "malformed"],
)
def test_build_rejects_a_bad_set_before_building(cli, write_recipe, tmp_path, override, message):
    output = tmp_path / "out"
    result = cli("build", write_recipe(), "-o", output, "--set", override)
    assert result.exit_code == 2, result.described
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.described
    assert not output.exists()


@pytest.mark.artifact
def test_build_with_set_records_the_overrides_in_the_manifest(cli, write_recipe, tmp_path):
    recipe, output = write_recipe(), tmp_path / "out"
    before = recipe.read_bytes()
    result = cli("build", recipe, "-o", output, "--set", "model.config.num_hidden_layers=1", "--set", "validate.shapes=[]")
    assert result.exit_code == 0, result.described
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["recipe"]["overrides"] == ["model.config.num_hidden_layers=1", "validate.shapes=[]"]
    assert manifest["recipe"]["resolved"]["model"]["config"]["num_hidden_layers"] == 1
    assert manifest["recipe"]["resolved"]["validate"]["shapes"] == []
    # The file is the build's recipe.yaml and keeps its hash; the overrides are beside it.
    assert recipe.read_bytes() == before == (output / "recipe.yaml").read_bytes()
    assert manifest["recipe"]["sha256"] == hashlib.sha256(before).hexdigest()
    import safetensors

    with safetensors.safe_open(output / "graph_module" / "weights.safetensors", "np") as weights:
        names = sorted(weights.keys())
    assert {name.split(".")[2] for name in names if name.startswith("encoder.layer.")} == {"0"}, names  # one layer, not 2
    # aot validate rebuilds the eager model from the recipe and the overrides the manifest recorded, not the file alone.
    validated = cli("validate", output)
    assert validated.exit_code == 0, validated.described
