"""Every shipped recipe builds offline, validates at >= 3 shapes, and its artifacts deploy.

Two sizes, two tiers (tests/conftest.py). The artifact tier (CI) builds every shipped recipe at a tiny size of its
architecture (TINY, through ``aot build --set``) and checks that the build succeeds, writes the artifacts the recipe
enables, and passes ``aot validate``. The full tier builds each recipe at its shipped size, once for the tests of
this module that need it, plus an extra build of bert.yaml and of minilm_int8.yaml in a second process to prove
byte-reproducibility.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from aot.builder.spine import build
from aot.export import run_onnx
from aot.inputs import dim_ranges, dynamic_axes, onnx_input_names, shape_cases
from aot.models import load_model
from aot.recipe.load import LoadedRecipe, fidelity_gate, load_recipe
from aot.recipe.plan import plan_build
from aot.tracing.export_trace import INFERRED
from aot.gates.accuracy import make_gate
from aot.gates.compare import eager_outputs
from aot.gates.compare import compare_outputs, eager_runner
from aot.tracing.outputs import flatten_outputs
from tests.conftest import invoke_aot, rehash_manifest
from tests.export.isolated import run_isolated

RECIPES_DIR = Path(__file__).parents[1] / "recipes"
SHIPPED = sorted(p.name for p in RECIPES_DIR.glob("*.yaml"))


def _needs_cuda(name: str) -> bool:
    return load_recipe(RECIPES_DIR / name).recipe.model.device.startswith("cuda")


# The CUDA recipes build where torch sees a GPU; elsewhere tests/test_recipe.py checks they fail cleanly.
BUILDABLE = [name for name in SHIPPED if torch.cuda.is_available() or not _needs_cuda(name)]
# bert_bf16.yaml ships no ONNX model: ONNX Runtime's CPU provider has no bfloat16 kernels.
WITH_ONNX = [name for name in BUILDABLE if load_recipe(RECIPES_DIR / name).recipe.export.onnx.enabled]



class _Builds(dict):
    """Each recipe built once, when a test first asks for it (so ``-k`` selects what gets built)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        self[name] = Path(build(RECIPES_DIR / name, self.root / Path(name).stem).output)
        return self[name]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    return _Builds(tmp_path_factory.mktemp("builds"))


# The artifact tier's size of each architecture family, keyed by the model_type of a recipe's inline config: every
# shipped recipe is built at it (aot build --set model.config.KEY=VALUE), so that its code path (trace, passes, gates,
# every artifact it enables, aot validate) runs in CI in seconds, not minutes. A shipped recipe of a family missing
# here fails its test, naming the model_type to add. Vocabularies stay as shipped: the shipped tokenizers and the
# accuracy and fidelity gates' texts need them. int4 groups of 32 need widths that 32 divides.
TINY = {
    "bert": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128},
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 4},
    "llama": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
    "mistral": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
    "resnet": {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]},
}
# Less work for the checks a recipe's sections ask for, whatever the family: the same code paths, fewer tokens. Eleven
# prompt tokens and eight new ones still decode past mistral_sliding_window.yaml's window of 16.
LESS_WORK = {
    "generation": ["generation.new_tokens=8"],
    "generation.fidelity": ["generation.fidelity.max_prompts=4", "generation.fidelity.new_tokens=4"],
}
# A recipe of a real checkpoint (model.pretrained, no inline config) cannot be resized: its weights fix the sizes, and
# the artifact tier builds it as shipped (all-MiniLM-L6-v2: 90 MB), up to this much weight on disk.
CHECKPOINT_BYTES = 200 * 2**20


def less_work(loaded: LoadedRecipe) -> list[str]:
    """The ``--set`` arguments of LESS_WORK for the sections the loaded recipe ``loaded`` has."""
    sections = loaded.resolved()
    return [setting for section, settings in LESS_WORK.items() if _has(sections, section) for setting in settings]


def set_options(settings: list[str]) -> list[str]:
    """``settings`` as ``aot build`` takes them: ``--set KEY=VALUE`` each."""
    return [argument for setting in settings for argument in ("--set", setting)]


def tiny_overrides(name: str) -> list[str]:
    """The ``--set`` arguments that build shipped recipe ``name`` at its family's tiny size (the sizes a small checkpoint
    has), with LESS_WORK for the sections it has."""
    loaded = load_recipe(RECIPES_DIR / name)
    less_work_settings = less_work(loaded)
    config = loaded.recipe.model.config
    if config is None:
        checkpoint = plan_build(loaded).model.pretrained
        assert checkpoint is not None, f"{name}: neither an inline config nor a checkpoint: TINY has no size for it"
        weights = sum(path.stat().st_size for path in checkpoint.rglob("*") if path.suffix in (".safetensors", ".bin"))
        assert 0 < weights <= CHECKPOINT_BYTES, f"{name}: a checkpoint of {weights} bytes is too large to build in the artifact tier"
        return less_work_settings
    sizes = TINY.get(config["model_type"])
    assert sizes, f"{name}: no tiny size for model_type {config['model_type']!r}: add one to TINY in tests/test_shipped_recipes.py"
    return [f"model.config.{key}={json.dumps(value)}" for key, value in sizes.items()] + less_work_settings


def _has(data: dict, dotted: str) -> bool:
    for key in dotted.split("."):
        if not isinstance(data, dict) or data.get(key) is None:
            return False
        data = data[key]
    return True


class _TinyBuilds(dict):
    """Each shipped recipe built at its tiny size by ``aot build`` (in process), once, when a test first asks for it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str):
        output = self.root / Path(name).stem
        overrides = tiny_overrides(name)
        arguments = ["build", str(RECIPES_DIR / name), "-o", str(output)] + set_options(overrides)
        result = invoke_aot(*arguments)
        described = f"aot {' '.join(arguments)}: exit {result.exit_code}\n{result.stderr}"
        self[name] = (output if result.exit_code == 0 else None, overrides, described)
        return self[name]

    def directory(self, name: str) -> Path:
        """The tiny build of ``name``; a failed build fails the test that asks, with the build's stderr."""
        output, _, described = self[name]
        assert output is not None, described
        return output


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory) -> _TinyBuilds:
    return _TinyBuilds(tmp_path_factory.mktemp("tiny-builds"))


def _recipes_page_table() -> set[str]:
    """The recipe files docs/recipes.md's table of shipped recipes names (rows ``| `recipes/NAME.yaml` | ... |``)."""
    page = (RECIPES_DIR.parent / "docs" / "recipes.md").read_text()
    return set(re.findall(r"^\| `recipes/([\w.-]+\.yaml)` \|", page, flags=re.MULTILINE))


def test_the_recipes_page_lists_exactly_the_recipes_that_ship():
    assert SHIPPED, f"precondition: {RECIPES_DIR} holds recipes"
    assert _recipes_page_table() == set(SHIPPED)


def test_some_shipped_recipe_builds_on_this_machine():
    # Else every build test below would be parametrized over nothing, and pass by not running.
    assert BUILDABLE, SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_loads_and_describes_itself(name):
    assert load_recipe(RECIPES_DIR / name).recipe.description


@pytest.mark.artifact
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=f"{name}: model.device is cuda, and torch sees no GPU"))
    if _needs_cuda(name) else name for name in SHIPPED
])
def test_every_shipped_recipe_builds_at_tiny_size_writes_its_artifacts_and_validates(tiny_builds, name, cli):
    from aot.export.aoti_package import AOTI_FILE
    from aot.recipe.load import is_decoder_with_cache, tokenizer_directory

    directory, overrides = tiny_builds.directory(name), tiny_builds[name][1]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["recipe"].get("overrides", []) == overrides, "built at the tiny size TINY gives"
    loaded = load_recipe(RECIPES_DIR / name)
    export = loaded.recipe.export
    enabled = {
        "recipe.yaml": True, "config.json": True,
        "graph_module/module.py": export.graph_module.enabled, "graph_module/weights.safetensors": export.graph_module.enabled,
        "model.onnx": export.onnx.enabled, AOTI_FILE: export.aoti.enabled,
        "preprocessor_config.json": loaded.recipe.model.image_processor is not None,
        "generation_config.json": is_decoder_with_cache(loaded),
        "tokenizer_config.json": tokenizer_directory(loaded) is not None,
    }
    written = {relative for relative in manifest["artifacts"] if (directory / relative).is_file()}
    assert set(manifest["artifacts"]) == written, "every artifact the manifest lists is there"
    assert {relative for relative, on in enabled.items() if on} <= written, sorted(written)
    assert not {relative for relative, on in enabled.items() if not on} & written, sorted(written)
    assert manifest["validation"] and all(v["ok"] for v in manifest["validation"]), manifest["validation"]
    result = cli("validate", directory)
    assert result.exit_code == 0, result.described


@pytest.mark.full
@pytest.mark.parametrize("name", BUILDABLE)
def test_manifest_reports_validation_at_three_shapes(builds, name):
    manifest = json.loads((builds[name] / "manifest.json").read_text())
    validation = manifest["validation"]
    assert validation, "the manifest must hold validation figures"
    assert (builds[name] / "model.onnx").exists() == (name in WITH_ONNX)
    for artifact in ("graph", "graph_module", "onnx") if name in WITH_ONNX else ("graph", "graph_module"):
        shapes = {v["shape"] for v in validation if v["artifact"] == artifact}
        assert len(shapes) >= 3, f"{artifact}: {shapes}"
    assert all(v["ok"] for v in validation)
    for relative, described in manifest["artifacts"].items():
        assert (builds[name] / relative).stat().st_size == described["bytes"]


@pytest.mark.full
@pytest.mark.parametrize("name", BUILDABLE)
def test_saved_graph_module_runs_without_aot_or_transformers(builds, name, tmp_path):
    loaded = load_recipe(RECIPES_DIR / name)
    model = load_model(plan_build(loaded).model)
    cases = shape_cases(plan_build(loaded).inputs, model)
    assert len(cases) >= 3
    gate = make_gate(plan_build(loaded).validation.gate, eager_runner(model), model)
    batches = gate.data.batches if gate else []
    runs = run_isolated({name: (builds[name] / "graph_module", [c.inputs for c in cases] + batches)}, tmp_path)[name]
    if gate:  # a recipe that trades precision is held to its accuracy gate, not to atol
        gated = iter(runs[len(cases):])
        result = gate.measure("standalone", lambda batch: next(gated))
        assert result.ok, result.summary()
        return
    tolerances = loaded.recipe.validate_
    for case, raw in zip(cases, runs):
        expected = eager_outputs(model, case.inputs)
        comparison = compare_outputs("standalone", case.label, expected, flatten_outputs(raw), tolerances.atol, tolerances.rtol)
        assert comparison.ok or _fidelity_gated(loaded, comparison), comparison.summary()


@pytest.mark.full
@pytest.mark.parametrize("name", WITH_ONNX)
def test_onnx_passes_checker_and_matches_eager_with_dynamic_axes(builds, name):
    path = builds[name] / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    loaded = load_recipe(RECIPES_DIR / name)
    graph_inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(path), load_external_data=False).graph.input}
    model = load_model(plan_build(loaded).model)
    onnx_names = onnx_input_names(plan_build(loaded).inputs, model)  # a decoder step's past: past_key_values.{i}.key in ONNX
    inferred = {dim for dim, bounds in dim_ranges(plan_build(loaded).inputs, model).items() if bounds == INFERRED}  # a decoder's mask length
    for name, axes in dynamic_axes(plan_build(loaded).inputs, model).items():
        for axis, dim in axes.items():
            found = graph_inputs[onnx_names.get(name, name)][axis]
            assert isinstance(found, str) and (dim in inferred or found == dim), (name, axis, found)
    float16 = loaded.recipe.export.onnx.float16
    tolerances = loaded.recipe.validate_.float16 if float16 else loaded.recipe.validate_
    initializer_types = {t.data_type for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    assert (onnx.TensorProto.FLOAT16 in initializer_types) == float16, initializer_types
    gate = make_gate(plan_build(loaded).validation.gate, eager_runner(model), model)
    if gate:  # a recipe that trades precision is held to its accuracy gate, not to atol
        result = gate.measure("onnx", lambda batch: run_onnx(path, batch))
        assert result.ok, result.summary()
        return
    for case in shape_cases(plan_build(loaded).inputs, model):
        expected = eager_outputs(model, case.inputs)
        named = {onnx_names.get(name, name): value for name, value in case.inputs.items()}
        comparison = compare_outputs("onnx", case.label, expected, run_onnx(path, named), tolerances.atol, tolerances.rtol)
        assert comparison.ok or _fidelity_gated(loaded, comparison), comparison.summary()


def _fidelity_gated(loaded, comparison) -> bool:
    """A decoder whose passes change its logits is held to its fidelity gate (test_gated_decoder_artifacts_meet_their_
    fidelity_gate), not to atol: here its outputs need eager's names and shapes, and finite values."""
    return fidelity_gate(loaded) is not None and comparison.problem is None and all(output.max_abs == output.max_abs for output in comparison.outputs)


def _without_timings(manifest: dict) -> dict:
    return {key: value for key, value in manifest.items() if key != "run"}


@pytest.mark.full
@pytest.mark.parametrize("name", ["bert.yaml", "minilm_int8.yaml"])  # float32, and int8 with its accuracy gate
def test_a_recipe_builds_byte_identical_in_two_processes(builds, tmp_path, name):
    second = tmp_path / "again"
    completed = subprocess.run(
        [sys.executable, "-m", "aot.cli", "build", str(RECIPES_DIR / name), "-o", str(second)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    first_manifest = json.loads((builds[name] / "manifest.json").read_text())
    second_manifest = json.loads((second / "manifest.json").read_text())
    assert first_manifest["artifacts"], "the manifest must list artifacts"
    assert first_manifest["artifacts"] == second_manifest["artifacts"]
    assert _without_timings(first_manifest) == _without_timings(second_manifest)
    for relative in first_manifest["artifacts"]:
        assert (builds[name] / relative).read_bytes() == (second / relative).read_bytes(), relative


@pytest.mark.full
def test_bert_onnx_shows_the_optimisations(builds):
    graph = onnx.load(str(builds["bert.yaml"] / "model.onnx"), load_external_data=False).graph
    op_types = [node.op_type for node in graph.node]
    assert op_types, "the ONNX graph must hold nodes"
    # merge_linears: one MatMul for Q, K and V; the attention output; the feed-forward block split in
    # two halves for the cpu target (two MatMuls each): six per layer.
    assert op_types.count("MatMul") == 6 * 12, sorted(set(op_types))
    # optimize: ort_fusions for the cpu target: attention and bias-GELU fused, residual adds and
    # LayerNormalization left apart (SkipLayerNormalization is slower than them on CPU).
    assert op_types.count("MultiHeadAttention") == 12
    assert op_types.count("BiasGelu") == 2 * 12
    assert op_types.count("SkipLayerNormalization") == 0
    assert op_types.count("LayerNormalization") == 2 * 12 + 1
    # ... each fed from a Sum, which ONNX Runtime does not fuse into SkipLayerNormalization when it loads the model
    assert op_types.count("Sum") == 2 * 12 + 1
    manifest = json.loads((builds["bert.yaml"] / "manifest.json").read_text())
    assert manifest["onnx_fusions"] == {
        "erf_gelu": 12, "sdpa": 12, "multi_head_attention": 12, "sdpa_via_mha": 0, "bias_gelu": 12, "split_feed_forward": 12,
        "sum_into_layer_norm": 25,
    }
    prepack = next(p for p in manifest["passes"] if p["name"] == "prepack_linear_weights")
    assert prepack["changed"] == 12 * 4 + 1, prepack  # every nn.Linear of the encoder, plus the pooler


DECODERS = [name for name in BUILDABLE if load_recipe(RECIPES_DIR / name).recipe.generation is not None]
# Decoders whose passes preserve the computation make eager's exact tokens; the others are gated on fidelity.
GATED_DECODERS = [name for name in DECODERS if fidelity_gate(load_recipe(RECIPES_DIR / name)) is not None]
EXACT_DECODERS = [name for name in DECODERS if name not in GATED_DECODERS]


def test_some_shipped_recipe_is_a_decoder_with_a_cache():
    assert len(DECODERS) >= 3, DECODERS  # GPT-2, a Llama-family one and a sliding-window one


@pytest.mark.full
@pytest.mark.parametrize("name", EXACT_DECODERS)
def test_decoder_artifacts_generated_eagers_exact_tokens(builds, name):
    manifest = json.loads((builds[name] / "manifest.json").read_text())
    generation = manifest["generation"]
    assert {g["artifact"] for g in generation} == {"onnx", "graph_module"}, generation
    prompts = {g["prompt"] for g in generation}
    assert any("batch 1" in p for p in prompts) and any("batch 2" in p and "left padded" in p for p in prompts), prompts
    assert len({p.split(",")[0] for p in prompts}) >= 2, "two prompt lengths at least"
    assert all(g["ok"] and g["new_tokens"] >= 32 for g in generation), [g["message"] for g in generation if not g["ok"]]


@pytest.mark.full
@pytest.mark.parametrize("name", GATED_DECODERS)
def test_gated_decoder_artifacts_meet_their_fidelity_gate(builds, name):
    fidelity = load_recipe(RECIPES_DIR / name).recipe.generation.fidelity
    generation = json.loads((builds[name] / "manifest.json").read_text())["generation"]
    scores = {g["artifact"]: g for g in generation if "metrics" in g}
    assert set(scores) == {"onnx", "graph_module"}, generation
    for artifact, score in scores.items():
        assert score["ok"] and score["positions"] >= 100 and set(score["thresholds"]) >= {"kl_mean"}, score
        assert score["metrics"]["kl_mean"] <= fidelity.max_kl_mean, (artifact, score)
    exact = [g for g in generation if "metrics" not in g]
    assert exact and all(g["judged_by"] == "fidelity gate" for g in exact), "exact tokens are recorded, the gate decides"


@pytest.mark.full
@pytest.mark.parametrize("name", EXACT_DECODERS)
def test_plain_onnx_runtime_greedy_loop_makes_eagers_tokens(builds, name):
    """A user's own loop over model.onnx (onnxruntime and numpy only, nothing from aot) against eager generate."""
    import numpy as np

    from tests.decoding.plain_loop import plain_onnx_runtime_greedy

    step = load_model(plan_build(load_recipe(RECIPES_DIR / name)).model)
    lm, config = step.causal_lm, step.config
    window = getattr(config, "sliding_window", None)

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, config.vocab_size, (2, 11))
    mask = np.ones_like(prompt)
    mask[1, :3], prompt[1, :3] = 0, 0  # the second row is 3 tokens shorter: left padding
    with torch.no_grad():
        expected = lm.generate(torch.from_numpy(prompt), attention_mask=torch.from_numpy(mask), do_sample=False,
                               max_new_tokens=32, eos_token_id=None, pad_token_id=0)[:, 11:].numpy()
    tokens, longest_past = plain_onnx_runtime_greedy(builds[name] / "model.onnx", prompt, mask, 32)
    np.testing.assert_array_equal(tokens, expected)
    if window is not None:  # the cache of a sliding-window model stays bounded however far it decodes
        assert longest_past <= window - 1, longest_past
    assert len({int(t) for t in expected[0]}) > 8, "random weights that emit few distinct tokens would prove little"


@pytest.mark.full
@pytest.mark.parametrize("name", BUILDABLE)
def test_the_build_directory_ships_what_a_deployment_needs(builds, name):
    from transformers import AutoConfig, AutoTokenizer

    from aot.recipe.load import is_decoder_with_cache, tokenizer_directory

    loaded = load_recipe(RECIPES_DIR / name)
    manifest = json.loads((builds[name] / "manifest.json").read_text())
    deployment = manifest["deployment"]
    assert deployment["config"] == "config.json" and "config.json" in manifest["artifacts"]
    config = AutoConfig.from_pretrained(str(builds[name]))
    inline = loaded.recipe.model.config
    assert config.model_type and (inline is None or config.model_type == inline["model_type"]), config.model_type
    assert (deployment["generation_config"] == "generation_config.json") == is_decoder_with_cache(loaded)
    source = tokenizer_directory(loaded)
    if deployment["task"] == "vision":  # pixels in: an image processor ships, and no tokenizer is missing
        assert deployment["processor"] == ["preprocessor_config.json"] and "preprocessor_config.json" in manifest["artifacts"]
        assert source is None and "tokenizer" not in deployment["missing"], deployment
        return
    if source is None:
        assert deployment["tokenizer"] == [] and "tokenizer" in deployment["missing"], deployment
        return
    assert deployment["tokenizer"] and all(file in manifest["artifacts"] for file in deployment["tokenizer"])
    assert deployment["texts_checked"] > 0
    shipped, original = AutoTokenizer.from_pretrained(str(builds[name])), AutoTokenizer.from_pretrained(str(source))
    for text in ["A man is eating food.", "Ahead-of-time builds, with ünïcödé and 123 numbers."]:
        assert shipped(text)["input_ids"] == original(text)["input_ids"]


@pytest.mark.artifact
def test_validate_catches_a_changed_and_a_missing_tokenizer_file(tiny_builds, tmp_path, cli):
    import shutil

    assert tiny_overrides("minilm.yaml") == [], "precondition: the artifact tier builds the real checkpoint as shipped"
    directory = Path(shutil.copytree(tiny_builds.directory("minilm.yaml"), tmp_path / "minilm"))
    assert cli("validate", directory).exit_code == 0, "the precondition: the build validates as shipped"
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["man"], vocab["food"] = vocab["food"], vocab["man"]  # two words of the recipe's first text swap ids
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert cli("validate", directory).exit_code == 7, "changed, not re-hashed: an integrity failure"
    rehash_manifest(directory, "tokenizer.json")  # a new manifest digest: this machine did not build it, so consent is given
    result = cli("validate", directory, "--trust-code")
    assert result.exit_code == 5 and "encodes 'A man is eating food.' differently" in result.stderr, result.described
    (directory / "tokenizer_config.json").unlink()
    result = cli("validate", directory)
    assert result.exit_code == 7 and "tokenizer_config.json: listed in manifest.json but missing" in result.stderr, result.described
