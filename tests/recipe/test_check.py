"""`aot check`'s library side: a recipe validated in full without building, torch untouched until the schema passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from aot.errors import RecipeError
from aot.builder.check import CheckReport, DimRange, check_recipe
from tests.conftest import TINY_BERT

RECIPES_DIR = Path(__file__).parents[2] / "recipes"


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("aot check built weights")

    monkeypatch.setattr(transformers.BertModel, "_from_config", classmethod(refuse))
    monkeypatch.setattr(transformers.BertModel, "from_pretrained", classmethod(refuse))


def test_shipped_bert_recipe_report(no_weights):
    report = check_recipe(RECIPES_DIR / "bert.yaml")
    assert isinstance(report, CheckReport)
    assert (report.name, report.model, report.model_class) == ("bert", "config: bert", "BertModel")
    assert report.passes == ["merge_linears", "remove_dropout", "dead_code_elimination"]
    assert report.graph_module_passes == ["prepack_linear_weights"]
    assert report.dims == {"batch": DimRange(2, True, 1, 64), "sequence": DimRange(64, True, 2, 512)}
    assert report.validation_shapes == [{"batch": 2, "sequence": 64}, {"batch": 1, "sequence": 128}, {"batch": 4, "sequence": 17}]
    assert report.not_checked == ["numerical validation (needs the weights)"]
    json.dumps(report.to_json())  # the CLI's --json form


def test_default_validation_shapes_are_reported(write_recipe, no_weights):
    report = check_recipe(write_recipe(TINY_BERT.split("validate:")[0]))
    assert report.validation_shapes == [{"batch": 2, "sequence": 8}, {"batch": 1, "sequence": 4}, {"batch": 3, "sequence": 15}]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("name: attention_mask", "name: attention_masks"), r"tiny.yaml:17: inputs.tensors\[1\].name: BertModel.forward has no input"),
        (lambda t: t.replace("dynamic: true}\n  tensors", "dynamic: true, max: 600}\n  tensors"), r"tiny.yaml:14: inputs.dims.sequence.max: dim 'sequence' max 600 is above the model's max_position_embeddings 512"),
        (lambda t: t.replace("    hidden_size: 32\n", "    hiden_size: 32\n"), r"tiny.yaml:4: model.config.hiden_size: unknown BertConfig key"),
        (lambda t: t.replace("{batch: 3, sequence: 12}", "{batch: 3, sequence: 12, beam: 2}"), r"tiny.yaml:23: validate.shapes\[1\].beam: no dim 'beam'"),
    ],
    ids=["input-name", "position-limit", "config-key", "shape-dim"],
)
def test_model_faults_are_found_without_weights(write_recipe, no_weights, edit, expected):
    assert check_recipe(write_recipe()).model_class == "BertModel"  # precondition
    text = edit(TINY_BERT)
    assert text != TINY_BERT
    with pytest.raises(RecipeError, match=expected) as caught:
        check_recipe(write_recipe(text))
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_a_special_token_id_the_config_class_does_not_declare_is_taken(write_recipe, no_weights):
    text = TINY_BERT.replace("    hidden_size: 32\n", "    hidden_size: 32\n    decoder_start_token_id: 0\n")
    assert text != TINY_BERT and "decoder_start_token_id" not in transformers.BertConfig().to_dict(), "precondition: undeclared"
    assert check_recipe(write_recipe(text)).model_class == "BertModel"
    with pytest.raises(RecipeError, match="model.config.decoder_start_token: unknown BertConfig key"):
        check_recipe(write_recipe(text.replace("decoder_start_token_id", "decoder_start_token")))


def test_pretrained_directory_needs_only_its_config(write_recipe, tmp_path, no_weights):
    directory = tmp_path / "bert-dir"
    directory.mkdir()
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64).save_pretrained(directory)
    assert not [path for path in directory.iterdir() if path.name != "config.json"]
    report = check_recipe(write_recipe("model:\n  pretrained: bert-dir\n" + TINY_BERT[TINY_BERT.index("inputs:"):]))
    assert (report.model, report.model_class) == (f"pretrained: {directory}", "BertModel")


def test_factory_inputs_are_left_to_the_build(write_recipe):
    text = "model:\n  factory: tests.models:noisy_linear\ninputs:\n  dims:\n    batch: {size: 2}\n  tensors:\n    - {name: y, shape: [batch, 8]}\n"
    report = check_recipe(write_recipe(text))
    assert report.model_class is None
    assert report.not_checked[0].startswith("input names and sizes against the model")


def test_cuda_recipe_checks_anywhere_and_says_what_it_left(no_weights):
    report = check_recipe(RECIPES_DIR / "bert_cuda.yaml")
    assert "whether this machine has device 'cuda'" in report.not_checked


def test_schema_faults_are_reported_before_torch_is_imported(write_recipe):
    path = write_recipe(TINY_BERT.replace("  seed: 0\n", "  sed: 0\n"))
    script = (
        "import sys\n"
        "from aot.builder.check import check_recipe\n"
        "from aot.errors import RecipeError\n"
        "try:\n"
        f"    check_recipe({str(path)!r})\n"
        "except RecipeError as error:\n"
        "    print(error)\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [f"{path}:10: model.sed: unknown key (did you mean 'seed'?)", "False False"]
