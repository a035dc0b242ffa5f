"""Faults of the model a recipe names are RecipeErrors naming the key or file, found before weights where possible."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers

from aot.errors import RecipeError
from aot.inputs import shape_cases
from aot.models import load_model
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.conftest import PRETRAINED, TINY_BERT


class WeightsBuilt(Exception):
    """Raised by a patched constructor: the weights were about to be built."""


def exploding_factory(features: int = 8) -> torch.nn.Module:
    raise ValueError(f"features={features} is not supported\nsecond line of detail")


def _load_model_error(path: Path) -> str:
    loaded = load_recipe(path)
    with pytest.raises(RecipeError) as caught:
        load_model(plan_build(loaded).model)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:"), message
    return message


FACTORY = """\
model:
  factory: {factory}
  factory_kwargs: {kwargs}
inputs:
  dims:
    batch: {{size: 2, dynamic: true}}
  tensors:
    - {{name: x, shape: [batch, 8], dtype: float32}}
"""


def test_factory_model_loads(write_recipe):
    model = load_model(plan_build(load_recipe(write_recipe(FACTORY.format(factory="tests.models:noisy_linear", kwargs="{features: 8}")))).model)
    assert isinstance(model, torch.nn.Module)


def test_factory_that_raises_names_factory_and_error(write_recipe):
    path = write_recipe(FACTORY.format(factory="tests.test_models:exploding_factory", kwargs="{features: 3}"))
    assert _load_model_error(path) == (
        f"{path}:2: model.factory: 'tests.test_models:exploding_factory' raised ValueError: features=3 is not supported"
    )


def test_factory_kwargs_that_do_not_fit_the_signature(write_recipe):
    path = write_recipe(FACTORY.format(factory="tests.models:noisy_linear", kwargs="{size: 8}"))
    assert _load_model_error(path) == (
        f"{path}:3: model.factory_kwargs: do not fit tests.models:noisy_linear(features=8): "
        "got an unexpected keyword argument 'size'"
    )


def test_factory_kwargs_of_the_wrong_type_fail_inside_the_factory(write_recipe):
    path = write_recipe(FACTORY.format(factory="tests.models:noisy_linear", kwargs="{features: eight}"))
    message = _load_model_error(path)
    assert message.startswith(f"{path}:2: model.factory: 'tests.models:noisy_linear' raised TypeError: ")


# --- inline config: checked before any weight exists


@pytest.fixture
def no_weights(monkeypatch):
    """Makes building the tiny BERT fail loudly, so a RecipeError proves the check ran before the weights."""

    def refuse(*args, **kwargs):
        raise WeightsBuilt

    monkeypatch.setattr(transformers.BertModel, "_from_config", classmethod(refuse))
    monkeypatch.setattr(transformers.BertModel, "from_pretrained", classmethod(refuse))


def test_wrong_input_name_is_found_before_the_weights(write_recipe, no_weights):
    with pytest.raises(WeightsBuilt):  # precondition: a sound recipe gets as far as the weights
        load_model(plan_build(load_recipe(write_recipe())).model)
    path = write_recipe(TINY_BERT.replace("name: attention_mask", "name: attention_masks"))
    message = _load_model_error(path)
    assert message.startswith(f"{path}:17: inputs.tensors[1].name: BertModel.forward has no input 'attention_masks' (it takes: ")


def test_auto_model_is_resolved_to_check_input_names(write_recipe, no_weights):
    text = TINY_BERT.replace("  class: BertModel\n", "").replace("name: attention_mask", "name: attention_masks")
    assert "BertModel.forward has no input 'attention_masks'" in _load_model_error(write_recipe(text))


def test_sequence_beyond_the_config_class_default_is_found_before_the_weights(write_recipe, no_weights):
    text = TINY_BERT.replace("sequence: {size: 8, dynamic: true}", "sequence: {size: 8, dynamic: true, max: 1024}")
    path = write_recipe(text)
    assert _load_model_error(path) == (
        f"{path}:14: inputs.dims.sequence.max: dim 'sequence' max 1024 is above the model's max_position_embeddings 512 "
        "(BertConfig's default): it is axis 1 of input 'input_ids'"
    )


def test_sequence_beyond_an_inline_limit_names_the_validation_shape(write_recipe, no_weights):
    path = write_recipe(TINY_BERT.replace("    vocab_size: 128\n", "    vocab_size: 128\n    max_position_embeddings: 10\n"))
    assert _load_model_error(path).endswith(
        "validate.shapes[1].sequence: validation shape sequence=12 is above the model's max_position_embeddings 10 "
        "(set in model.config): it is axis 1 of input 'input_ids'"
    )


def test_unknown_class_is_named(write_recipe):
    path = write_recipe(TINY_BERT.replace("class: BertModel", "class: BertModle"))
    assert _load_model_error(path) == f"{path}:9: model.class: transformers has no class 'BertModle'"


def test_shape_cases_follow_the_recipe(write_recipe):
    loaded = load_recipe(write_recipe())
    cases = shape_cases(plan_build(loaded).inputs, load_model(plan_build(loaded).model))
    assert [case.dims for case in cases] == [{"batch": 2, "sequence": 8}, {"batch": 1, "sequence": 5}, {"batch": 3, "sequence": 12}]
    assert cases[2].inputs["input_ids"].shape == (3, 12)


# --- pretrained directories with broken weights



@pytest.fixture(scope="module")
def tiny_bert_weights(tmp_path_factory) -> Path:
    """A tiny BERT saved twice: as safetensors (transformers' default) and as a torch checkpoint."""
    directory = tmp_path_factory.mktemp("tiny-bert")
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128
    )
    model = transformers.BertModel(config)
    model.save_pretrained(directory / "safetensors")
    checkpoint = directory / "torch"
    checkpoint.mkdir()
    shutil.copy(directory / "safetensors" / "config.json", checkpoint)
    torch.save(model.state_dict(), checkpoint / "pytorch_model.bin")
    return directory


def _pretrained_recipe(write_recipe, tiny_bert_weights: Path, kind: str) -> Path:
    path = write_recipe(PRETRAINED)
    shutil.copytree(tiny_bert_weights / kind, path.parent / "pretrained")
    return path


@pytest.mark.parametrize("kind", ["safetensors", "torch"])
def test_intact_pretrained_weights_load(write_recipe, tiny_bert_weights, kind):
    model = load_model(plan_build(load_recipe(_pretrained_recipe(write_recipe, tiny_bert_weights, kind))).model)
    assert type(model).__name__ == "BertModel"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda data: data[: len(data) // 2], "incomplete metadata, file not fully covered"),
        (lambda data: data[:100], "invalid header length"),
        (lambda data: b"\xff" * len(data), "header too large"),
        (lambda data: b"", "header too small"),
    ],
    ids=["truncated", "header-only", "garbage", "empty"],
)
def test_corrupt_safetensors_names_the_weights_file(write_recipe, tiny_bert_weights, damage, problem):
    path = _pretrained_recipe(write_recipe, tiny_bert_weights, "safetensors")
    weights = path.parent / "pretrained" / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    message = _load_model_error(path)
    assert message.startswith(f"{path}:2: model.pretrained: weights file {weights} is corrupt or truncated: ")
    assert problem in message


@pytest.mark.parametrize(
    "damage",
    [lambda data: data[: len(data) // 2], lambda data: b"not a checkpoint" * 100],
    ids=["truncated", "garbage"],
)
def test_corrupt_torch_checkpoint_names_the_weights_file(write_recipe, tiny_bert_weights, damage):
    path = _pretrained_recipe(write_recipe, tiny_bert_weights, "torch")
    weights = path.parent / "pretrained" / "pytorch_model.bin"
    weights.write_bytes(damage(weights.read_bytes()))
    message = _load_model_error(path)
    assert message.startswith(f"{path}:2: model.pretrained: cannot load {weights.parent} (pytorch_model.bin): ")


def test_pretrained_input_names_are_checked_before_the_weights(write_recipe, tiny_bert_weights, no_weights):
    path = _pretrained_recipe(write_recipe, tiny_bert_weights, "safetensors")
    with pytest.raises(WeightsBuilt):  # precondition
        load_model(plan_build(load_recipe(path)).model)
    path.write_text(PRETRAINED.replace("name: input_ids", "name: input_idz"))
    assert "inputs.tensors[0].name: BertModel.forward has no input 'input_idz'" in _load_model_error(path)


def test_loading_pretrained_weights_draws_nothing_on_stderr(write_recipe, tiny_bert_weights, capfd):
    """stderr is for aot's one error line: transformers' "Loading weights" bar must not reach it."""
    recipe = _pretrained_recipe(write_recipe, tiny_bert_weights, "safetensors")
    capfd.readouterr()
    model = load_model(plan_build(load_recipe(recipe)).model)
    assert type(model).__name__ == "BertModel"
    assert capfd.readouterr().err == ""


class _Entered:
    """Records when it is entered and left."""

    def __init__(self):
        self.events: list[str] = []

    def __enter__(self):
        self.events.append("enter")

    def __exit__(self, *exc_info):
        self.events.append("exit")


def test_while_weights_load_is_entered_around_the_weights_of_a_config_model(write_recipe, no_weights):
    beside = _Entered()
    with pytest.raises(WeightsBuilt):  # the weights are built inside it: it was entered, and left on the error
        load_model(plan_build(load_recipe(write_recipe())).model, while_weights_load=beside)
    assert beside.events == ["enter", "exit"]


@pytest.mark.parametrize("kind", ["safetensors"])
def test_while_weights_load_is_entered_around_pretrained_weights(write_recipe, tiny_bert_weights, kind):
    beside = _Entered()
    model = load_model(plan_build(load_recipe(_pretrained_recipe(write_recipe, tiny_bert_weights, kind))).model, while_weights_load=beside)
    assert type(model).__name__ == "BertModel" and beside.events == ["enter", "exit"]


def test_a_factory_runs_alone(write_recipe):
    beside = _Entered()
    load_model(plan_build(load_recipe(write_recipe(FACTORY.format(factory="tests.models:noisy_linear", kwargs="{features: 8}")))).model,
               while_weights_load=beside)
    assert beside.events == []
