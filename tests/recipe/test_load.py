"""Bad recipes fail at load time with one line naming file, line and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aot.errors import RecipeError
from aot.recipe.load import load_recipe, recipe_json_schema_text
from aot.recipe.plan import plan_build
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
        (lambda t: t.replace("  seed: 0\n", "  seed: 0\n  sed: 1\n"), r"tiny.yaml:11: model.sed: unknown key \(did you mean 'seed'\?\)$"),
        (lambda t: t.replace("seed: 0", "seed: zero"), r"tiny.yaml:10: model.seed: Input should be a valid integer"),
        # torch's seeds end at 2**64 - 1, and each shape case's inputs are seeded with seed + its index
        (lambda t: t.replace("seed: 0", "seed: 99999999999999999999"), r"tiny.yaml:10: model.seed: Input should be less than or equal to 9223372036854775807"),
        (lambda t: t.replace("seed: 0", f"seed: {-2**63 - 1}"), r"tiny.yaml:10: model.seed: Input should be greater than or equal to -9223372036854775808"),
        (lambda t: t.replace("  - merge_linears", "  - merge_lineras"), r"tiny.yaml:19: passes\[0\]: unknown pass 'merge_lineras' \(did you mean 'merge_linears'\?\)$"),
        (lambda t: t.replace("    batch: {size: 2", "    batch: {size: -2"), r"tiny.yaml:13: inputs.dims.batch.size"),
        (lambda t: t.replace("passes:\n  - merge_linears", "passes:\n  - merge_linears: {bogus: 1}"), r"tiny.yaml:19: passes\[0\].merge_linears.bogus: unknown key"),
        (lambda t: t + "validate: {}\n", r"tiny.yaml:\d+: validate: duplicate key"),
        (lambda t: t.replace("  class: BertModel\n", "  class: BertModel\n  pretrained: somewhere\n"), r"tiny.yaml:\d+: model: give exactly one"),
        (lambda t: t.replace("shape: [batch, sequence]}", "shape: [batch, seq]}", 1), r"tiny.yaml:\d+: inputs: input 'input_ids' uses dim 'seq'"),
    ],
    ids=["unknown-key", "wrong-type", "seed-too-large", "seed-negative", "unknown-pass", "bad-range", "unknown-pass-option", "duplicate-key", "two-sources", "unknown-dim"],
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


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("  - merge_linears: [1, 2]", r"passes\[0\]: the options of 'merge_linears' are a mapping \{option: value\}, not list \[1, 2\]$"),
        ("  - merge_linears: 'yes'", r"passes\[0\]: the options of 'merge_linears' are a mapping \{option: value\}, not str 'yes'$"),
        ("  - [merge_linears]", r"passes\[0\]: a pass is a name or a one-key mapping \{name: \{option: value\}\} \(got \['merge_linears'\]\)$"),
    ],
    ids=["list", "string", "list-entry"],
)
def test_a_pass_entry_of_the_wrong_form_is_said_in_the_recipes_terms(write_recipe, entry, expected):
    assert "  - merge_linears\n" in TINY_BERT and load_recipe(write_recipe()).passes  # precondition: a pass by its name
    with pytest.raises(RecipeError, match=expected):
        load_recipe(write_recipe(TINY_BERT.replace("  - merge_linears\n", entry + "\n", 1)))


def test_every_shipped_recipe_meets_the_published_schema_and_a_misspelt_pass_does_not():
    import jsonschema
    import yaml

    validator = jsonschema.Draft202012Validator(json.loads(recipe_json_schema_text()))
    recipes = sorted((Path(__file__).parents[2] / "recipes").rglob("*.yaml"))
    assert len(recipes) >= 20, "precondition: the shipped recipes"
    for path in recipes:
        errors = [error.message for error in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, (path, errors)
    recipe = yaml.safe_load(TINY_BERT)
    for wrong in ("merge_linear", {"merge_linears": {"min_group_size": "three"}}, {"merge_linears": {}, "remove_dropout": {}}):
        recipe["passes"] = [wrong]
        assert list(validator.iter_errors(recipe)), wrong


def test_published_schema_is_current():
    from pathlib import Path

    published = Path(__file__).parents[2] / "aot" / "schema" / "recipe.schema.json"
    assert published.read_text() == recipe_json_schema_text(), "run `aot schema > aot/schema/recipe.schema.json`"
    schema = json.loads(published.read_text())
    assert schema["additionalProperties"] is False
    assert "model" in schema["required"]


def test_the_cuda_recipe_loads_and_says_what_it_needs_where_torch_has_no_gpu():
    from pathlib import Path

    import torch

    from aot.models import load_model

    path = Path(__file__).parents[2] / "recipes" / "bert_cuda.yaml"
    loaded = load_recipe(path)
    onnx_options = loaded.recipe.export.onnx
    assert (onnx_options.target, onnx_options.precision, onnx_options.float16) == ("cuda", "auto", True)
    assert loaded.recipe.validate_.float16.atol == 2e-2
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the shipped-recipe tests build this recipe")
    with pytest.raises(RecipeError, match=r"bert_cuda.yaml:\d+: model.device: 'cuda' is asked for, but this machine's torch sees no CUDA device"):
        load_model(plan_build(loaded).model)


def test_precision_auto_follows_the_target(write_recipe):
    cpu = load_recipe(write_recipe()).recipe.export.onnx
    assert (cpu.target, cpu.float16) == ("cpu", False)
    forced = load_recipe(write_recipe(TINY_BERT + "export:\n  onnx: {precision: float16}\n")).recipe.export.onnx
    assert forced.float16
    cuda32 = load_recipe(write_recipe(TINY_BERT + "export:\n  onnx: {target: cuda, precision: float32}\n")).recipe.export.onnx
    assert not cuda32.float16


SEQUENCE = "    sequence: {size: 8, dynamic: true}\n"
BATCH = "    batch: {size: 2, dynamic: true}\n"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace(SEQUENCE, SEQUENCE.replace("}", ", max: 6}")), r"tiny.yaml:14: inputs.dims.sequence: size 8 is above max 6"),
        (lambda t: t.replace(BATCH, BATCH.replace("}", ", min: 3}")), r"tiny.yaml:13: inputs.dims.batch: size 2 is below min 3"),
        (lambda t: t.replace(BATCH, BATCH.replace("}", ", min: 4, max: 3}")), r"tiny.yaml:13: inputs.dims.batch: min 4 is above max 3"),
        (
            lambda t: t.replace(SEQUENCE, SEQUENCE.replace("}", ", max: 10}")),
            r"tiny.yaml:23: validate.shapes\[1\].sequence: 12 is above the max 10 of dim 'sequence'",
        ),
        (
            lambda t: t.replace(SEQUENCE, SEQUENCE.replace("}", ", min: 6}")),
            r"tiny.yaml:22: validate.shapes\[0\].sequence: 5 is below the min 6 of dim 'sequence'",
        ),
        (lambda t: t.replace("{batch: 1, sequence: 5}", "{batch: 0, sequence: 5}"), r"tiny.yaml:22: validate.shapes\[0\].batch: 0 is below the min 1"),
        (
            lambda t: t.replace("{batch: 1, sequence: 5}", "{batch: 1, sequense: 5}"),
            r"tiny.yaml:22: validate.shapes\[0\].sequense: no dim 'sequense' under inputs.dims",
        ),
        (
            lambda t: t.replace(BATCH, BATCH.replace("true", "false")),
            r"tiny.yaml:22: validate.shapes\[0\].batch: dim 'batch' is not dynamic, so it stays 2",
        ),
        (lambda t: t.replace("validate:\n", "validate:\n  rtol: .inf\n"), r"tiny.yaml:21: validate.rtol: Input should be a finite number"),
        (lambda t: t.replace("validate:\n", "validate:\n  atol: .nan\n"), r"tiny.yaml:21: validate.atol: Input should be a finite number"),
        (lambda t: t.replace("validate:\n", "validate:\n  atol: -1.0e-3\n"), r"tiny.yaml:21: validate.atol: Input should be greater than or equal to 0"),
        (
            lambda t: t.replace("validate:\n", "validate:\n  float16: {atol: 1.0e-2, rtol: .inf}\n"),
            r"tiny.yaml:21: validate.float16.rtol: Input should be a finite number",
        ),
    ],
    ids=[
        "size-above-max", "size-below-min", "min-above-max", "shape-above-max", "shape-below-min", "shape-zero",
        "shape-unknown-dim", "shape-static-dim", "rtol-inf", "atol-nan", "atol-negative", "float16-rtol-inf",
    ],
)
def test_sizes_and_tolerances_are_checked_at_load(write_recipe, edit, expected):
    assert load_recipe(write_recipe()).recipe.validate_.shapes  # precondition: the unedited recipe loads
    text = edit(TINY_BERT)
    assert text != TINY_BERT, "the edit must change the recipe"
    with pytest.raises(RecipeError, match=expected) as caught:
        load_recipe(write_recipe(text))
    assert caught.value.exit_code == 2
    assert "\n" not in str(caught.value)


PRETRAINED = """\
model:
  pretrained: tiny-pretrained
  class: BertModel
inputs:
  dims:
    batch: {size: 2, dynamic: true, max: 4}
    sequence: {size: 8, dynamic: true, max: 32}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
"""


def _pretrained_dir(tmp_path, config_text: str):
    directory = tmp_path / "tiny-pretrained"
    directory.mkdir()
    (directory / "config.json").write_text(config_text)
    return directory


def test_pretrained_sequence_beyond_position_embeddings_names_dim_and_config_key(write_recipe, tmp_path):
    directory = _pretrained_dir(tmp_path, json.dumps({"model_type": "bert", "max_position_embeddings": 32}))
    assert load_recipe(write_recipe(PRETRAINED)).recipe.inputs.dims["sequence"].max == 32  # precondition: 32 fits
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 16}))
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(PRETRAINED))
    assert str(caught.value) == (
        f"{tmp_path / 'tiny.yaml'}:7: inputs.dims.sequence.max: dim 'sequence' max 32 is above the model's "
        f"max_position_embeddings 16 ({directory / 'config.json'}): it is axis 1 of input 'input_ids'"
    )


def test_pretrained_gpt2_limit_is_n_positions_and_covers_validation_shapes(write_recipe, tmp_path):
    _pretrained_dir(tmp_path, json.dumps({"model_type": "gpt2", "n_positions": 16}))
    text = PRETRAINED.replace(", max: 32}", "}") + "validate:\n  shapes:\n    - {sequence: 20}\n"
    with pytest.raises(RecipeError, match=r"tiny.yaml:12: validate.shapes\[0\].sequence: validation shape sequence=20 is above the model's n_positions 16"):
        load_recipe(write_recipe(text))


def test_default_validation_shape_beyond_the_limit_asks_for_a_max(write_recipe, tmp_path):
    _pretrained_dir(tmp_path, json.dumps({"model_type": "bert", "max_position_embeddings": 16}))
    text = PRETRAINED.replace("sequence: {size: 8, dynamic: true, max: 32}", "sequence: {size: 10, dynamic: true}")
    with pytest.raises(RecipeError, match=r"tiny.yaml:7: inputs.dims.sequence: default validation shape sequence=19 \(set the dim's max\)"):
        load_recipe(write_recipe(text))


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", "max_position_embeddings": 16, "rope_theta": 10000.0},
        {"model_type": "llama", "max_position_embeddings": 16, "rope_parameters": {"rope_type": "default"}},
        {"model_type": "deberta-v2", "max_position_embeddings": 16, "position_biased_input": False},
    ],
    ids=["rope-theta", "rope-parameters", "no-absolute-positions"],
)
def test_position_limit_is_only_checked_for_a_table_of_positions(write_recipe, tmp_path, config):
    # Rotary embeddings are computed for any position: their max_position_embeddings is no hard limit.
    directory = _pretrained_dir(tmp_path, json.dumps({"model_type": "bert", "max_position_embeddings": 16}))
    with pytest.raises(RecipeError, match="max_position_embeddings 16"):  # precondition: 32 is checked against 16
        load_recipe(write_recipe(PRETRAINED))
    (directory / "config.json").write_text(json.dumps(config))
    assert load_recipe(write_recipe(PRETRAINED)).recipe.inputs.dims["sequence"].max == 32


@pytest.mark.parametrize(
    ("config_text", "expected"),
    [("{not json", r"cannot read .*config.json: Expecting property name"), ("[1, 2]", r".*config.json holds no JSON object")],
    ids=["not-json", "not-an-object"],
)
def test_pretrained_config_json_that_does_not_parse(write_recipe, tmp_path, config_text, expected):
    _pretrained_dir(tmp_path, config_text)
    with pytest.raises(RecipeError, match=r"tiny.yaml:2: model.pretrained: " + expected) as caught:
        load_recipe(write_recipe(PRETRAINED))
    assert "\n" not in str(caught.value)


def test_the_largest_seed_loads_and_leaves_room_for_each_shape_case_seed(write_recipe):
    import torch

    largest = 2**63 - 1
    plan = plan_build(load_recipe(write_recipe(TINY_BERT.replace("seed: 0", f"seed: {largest}"))))
    assert plan.inputs.seed == largest
    with torch.random.fork_rng():  # the suite's own generator state goes on as it was
        torch.manual_seed(plan.model.spec.seed)
    torch.Generator().manual_seed(plan.inputs.seed + len(plan.inputs.case_dims) - 1)  # the last shape case's inputs
    assert load_recipe(write_recipe(TINY_BERT.replace("seed: 0", "seed: -1"))).recipe.model.seed == -1  # as torch takes it
    with pytest.raises(RecipeError, match=r"tiny.yaml:10: model.seed: Input should be less than or equal to"):
        load_recipe(write_recipe(TINY_BERT.replace("seed: 0", f"seed: {largest + 1}")))


PRETRAINED_DECODER = """\
model:
  pretrained: tiny-pretrained
  class: GPT2LMHeadModel
trace: {frontend: export}
generation:
  cache: true
  new_tokens: 8
  fidelity: {prompts: prompts.txt, max_prompt_tokens: 16, new_tokens: 8, min_top1_agreement: 0.9}
"""


def test_pretrained_decoder_generation_lengths_within_n_positions(write_recipe, tmp_path):
    """Generation feeds the prompt, then each new token but the last: prompt + new_tokens - 1 positions."""
    (tmp_path / "prompts.txt").write_text("a prompt\n")
    directory = _pretrained_dir(tmp_path, json.dumps({"model_type": "gpt2", "n_positions": 23}))
    config_path = directory / "config.json"
    assert load_recipe(write_recipe(PRETRAINED_DECODER)).recipe.generation.fidelity.new_tokens == 8  # precondition: 16 + 8 - 1 fits
    config_path.write_text(json.dumps({"model_type": "gpt2", "n_positions": 22}))
    with pytest.raises(RecipeError) as caught:
        load_recipe(write_recipe(PRETRAINED_DECODER))
    assert str(caught.value) == (
        f"{tmp_path / 'tiny.yaml'}:8: generation.fidelity.max_prompt_tokens: max_prompt_tokens 16 + generation.fidelity.new_tokens 8 "
        f"- 1 = 23 tokens is above the model's n_positions 22 ({config_path}): the fidelity gate generates "
        "new_tokens greedily after each prompt, cut to max_prompt_tokens"
    )
    assert caught.value.exit_code == 2
    config_path.write_text(json.dumps({"model_type": "gpt2", "n_positions": 17}))  # the default prompt lengths [5, 11]
    expected = r"tiny.yaml:5: generation.prompt_lengths\[1\]: prompt length 11 \+ generation.new_tokens 8 - 1 = 18 tokens is above"
    with pytest.raises(RecipeError, match=expected + " the model's n_positions 17"):
        load_recipe(write_recipe(PRETRAINED_DECODER))


LARGE_RECIPES = sorted((Path(__file__).parents[2] / "recipes" / "large").glob("*.yaml"))


@pytest.mark.parametrize("path", LARGE_RECIPES, ids=lambda path: path.name)
def test_every_large_recipe_loads_beside_the_checkpoint_the_repo_writes(path, tmp_path):
    """The large recipes build outside CI (their checkpoints are GBs, or fetched): their text must still load, beside the
    config of a checkpoint ``scripts/write_checkpoint.py`` or ``scripts/real_checkpoint.py`` writes (its weights are not
    read at load)."""
    import runpy
    import shutil

    import safetensors.torch
    import torch
    import transformers

    assert LARGE_RECIPES, "precondition: recipes/large holds recipes"
    scripts = path.parents[2] / "scripts"
    real = runpy.run_path(str(scripts / "real_checkpoint.py"), run_name="shapes")["REAL"]
    shapes = {**runpy.run_path(str(scripts / "write_checkpoint.py"), run_name="shapes")["SHAPES"],
              **{name: spec["config"] for name, spec in real.items()}}
    (tmp_path / "recipes" / "large").mkdir(parents=True)
    shutil.copytree(path.parents[1] / "data", tmp_path / "recipes" / "data")
    recipe = shutil.copy(path, tmp_path / "recipes" / "large")
    pretrained = _pretrained_text(path)  # ../../checkpoints/NAME, from the recipe's directory
    name = Path(pretrained).name
    assert name in shapes, f"{path.name}: no checkpoint named {name} in write_checkpoint.py or real_checkpoint.py"
    checkpoint = tmp_path / "recipes" / "large" / pretrained
    transformers.AutoConfig.for_model(**shapes[name]).save_pretrained(checkpoint)
    # weights_dtype asks for safetensors weights in that dtype (the checkpoint script writes bfloat16)
    safetensors.torch.save_file({"placeholder": torch.zeros(1, dtype=torch.bfloat16)}, checkpoint / "model.safetensors")
    loaded = load_recipe(recipe)
    assert loaded.recipe.generation is not None and loaded.recipe.generation.fidelity is not None, "a gated decoder"


def _pretrained_text(path: Path) -> str:
    import yaml

    return yaml.safe_load(path.read_text())["model"]["pretrained"]
