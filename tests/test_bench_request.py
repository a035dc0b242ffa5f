"""aot bench refuses, before any runner starts and before a recipe is built, what the build cannot take: sizes outside
what it was checked for, a peer the recipe cannot provide, options that do not apply (one line, exit 2, nothing written)."""

from __future__ import annotations

import pytest

from aot.bench.peer_groups import CHECKPOINT_PEERS, DECODER_PEERS
from aot.bench.request import check_request
from aot.errors import RecipeError
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.conftest import TINY_BERT, invoke_aot, run_aot

# TINY_BERT with bounded dims: batch 1 to 4, sequence 2 to 16
BOUNDED = TINY_BERT.replace("batch: {size: 2, dynamic: true}", "batch: {size: 2, dynamic: true, min: 1, max: 4}").replace(
    "sequence: {size: 8, dynamic: true}", "sequence: {size: 8, dynamic: true, min: 2, max: 16}")

# A decoder whose position table is 16 long, built from a config: no pretrained checkpoint
DECODER = """\
model:
  config: {model_type: gpt2, n_embd: 32, n_layer: 1, n_head: 2, vocab_size: 128, n_positions: 16}
  class: GPT2LMHeadModel
trace: {frontend: export}
generation: {cache: true, new_tokens: 4, prompt_lengths: [3]}
"""


def _refused_up_front(tmp_path, recipe, *arguments: str) -> str:
    """``aot bench RECIPE -o OUT ARGS`` answered in one line with exit 2, the recipe not built: that line."""
    out = tmp_path / "out"
    result = invoke_aot("bench", recipe, "-o", out, "--runs", "1", "--warmup", "0", *arguments)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (arguments, result.described)
    assert not out.exists(), "refused before the build: nothing written"
    return lines[0]


@pytest.mark.parametrize(("arguments", "message"), [
    (("-s", "batch=0"), "--shape batch=0: 0 is below the min 1 of dim 'batch' (this build takes batch 1 to 4)"),
    (("-s", "batch=-1"), "--shape batch=-1: -1 is below the min 1 of dim 'batch'"),
    (("-s", "batch=2,5", "-s", "sequence=8"), "--shape batch=5: 5 is above the max 4 of dim 'batch' (this build takes batch 1 to 4)"),
    (("-s", "sequence=1"), "--shape sequence=1: 1 is below the min 2 of dim 'sequence' (this build takes sequence 2 to 16)"),
    (("-s", "sequence=17"), "--shape sequence=17: 17 is above the max 16 of dim 'sequence'"),
])
def test_an_encoder_size_outside_its_dims_ranges_is_refused_before_the_build(write_recipe, tmp_path, arguments, message):
    plan = plan_build(load_recipe(write_recipe(BOUNDED)))
    dims = plan.inputs.spec.dims
    assert (dims["batch"].min, dims["batch"].max, dims["sequence"].min, dims["sequence"].max) == (1, 4, 2, 16)
    assert check_request(plan, {"batch": [1, 4], "sequence": [2, 16]}).shapes[-1] == {"batch": 4, "sequence": 16}
    assert message in _refused_up_front(tmp_path, write_recipe(BOUNDED), *arguments)


def test_a_static_dim_keeps_its_size(write_recipe):
    static = TINY_BERT.replace("batch: {size: 2, dynamic: true}", "batch: {size: 2}")
    static = static.replace("    - {batch: 1, sequence: 5}\n    - {batch: 3, sequence: 12}\n", "    - {sequence: 5}\n")
    plan = plan_build(load_recipe(write_recipe(static)))
    assert not plan.inputs.spec.dims["batch"].dynamic
    assert check_request(plan, {"batch": [2]}).shapes == [{"batch": 2, "sequence": 8}]
    with pytest.raises(RecipeError, match=r"^--shape batch=3: dim 'batch' is not dynamic, so it stays 2 \(this build takes batch 2 only\)$"):
        check_request(plan, {"batch": [3]})


def test_a_sequence_beyond_the_position_table_is_refused_where_the_dim_has_no_max(write_recipe, tmp_path):
    recipe = write_recipe(TINY_BERT.replace("vocab_size: 128", "vocab_size: 128\n    max_position_embeddings: 32"))
    plan = plan_build(load_recipe(recipe))
    assert plan.inputs.spec.dims["sequence"].max is None  # only the model's positions bound it
    assert check_request(plan, {"sequence": [32]}).shapes == [{"batch": 2, "sequence": 32}]
    line = _refused_up_front(tmp_path, recipe, "-s", "sequence=8,33")
    assert "--shape sequence=33: 33 is above the model's max_position_embeddings 32" in line and "input_ids" in line, line


@pytest.mark.parametrize(("arguments", "message"), [
    (("-s", "prompt=0"), "--shape prompt=0: 0 is below the min 1 of dim 'prompt' (this build takes prompt from 1)"),
    (("-s", "batch=0", "-s", "prompt=4"), "--shape batch=0: 0 is below the min 1 of dim 'batch'"),
    (("-s", "prompt=14", "--new-tokens", "4"),
     "--shape prompt=14: 14 tokens + --new-tokens 4 - 1 = 17 positions, above the model's n_positions 16 (GPT2Config): "
     "with --new-tokens 4 this build takes prompt 1 to 13"),
    (("--new-tokens", "4"), "--shape prompt=32 (the default): 32 tokens + --new-tokens 4 - 1 = 35 positions"),
    (("-s", "prompt=1", "--new-tokens", "17"), "--new-tokens 17: even a 1-token prompt feeds 17 positions, above the model's n_positions 16"),
    (("-s", "prompt=4", "--new-tokens", "4", "--peers", "ort_genai"), "--peers ort_genai: ort_genai builds its model from the recipe's model.pretrained checkpoint"),
    (("-s", "prompt=4", "--new-tokens", "4", "--peers", "eager_bf16,llama_cpp"), "--peers llama_cpp: llama_cpp writes its GGUF file from the recipe's model.pretrained"),
])
def test_what_a_decoder_build_cannot_take_is_refused_before_the_build(write_recipe, tmp_path, arguments, message):
    plan = plan_build(load_recipe(write_recipe(DECODER)))
    assert plan.model.decoder_step and plan.model.pretrained is None
    fitting = check_request(plan, {"batch": [1, 2], "prompt": [13]}, ("eager_bf16",), new_tokens=4)  # 13 + 4 - 1 = 16 positions
    assert fitting.peers == ("eager_bf16",) and fitting.shapes == [{"batch": 1, "prompt": 13}, {"batch": 2, "prompt": 13}]
    assert message in _refused_up_front(tmp_path, write_recipe(DECODER), *arguments)


def test_the_decoder_group_skips_the_peers_the_recipe_cannot_provide_and_says_why(write_recipe):
    plan = plan_build(load_recipe(write_recipe(DECODER)))
    assert plan.model.pretrained is None and set(CHECKPOINT_PEERS) < set(DECODER_PEERS)
    request = check_request(plan, {"prompt": [4]}, ("decoder",), new_tokens=4)
    assert request.peers == ("eager_bf16",)
    assert set(request.skipped_peers) == set(CHECKPOINT_PEERS)
    for reason in request.skipped_peers.values():
        assert "model.pretrained checkpoint, which this recipe has not" in reason and "--peers decoder" in reason, reason
    with pytest.raises(RecipeError, match="^--peers llama_cpp: llama_cpp writes its GGUF file"):  # named too: not dropped
        check_request(plan, {"prompt": [4]}, ("decoder", "llama_cpp"), new_tokens=4)


def test_new_tokens_on_an_encoder_is_refused_before_the_build(write_recipe, tmp_path):
    plan = plan_build(load_recipe(write_recipe()))
    assert not plan.model.decoder_step and check_request(plan).new_tokens == 32
    line = _refused_up_front(tmp_path, write_recipe(), "--new-tokens", "5")
    assert "--new-tokens 5: applies to a decoder build (generation.cache), not to this one" in line, line


def test_output_is_refused_for_a_build_directory(cli, tiny_build, tmp_path, monkeypatch):
    import aot.bench.driver

    monkeypatch.setattr(aot.bench.driver, "_hosts", lambda *arguments: pytest.fail("a runner started"))
    out = tmp_path / "elsewhere"
    assert (tiny_build / "manifest.json").is_file()
    result = cli("bench", tiny_build, "-o", out, "--runs", "1", "--warmup", "0")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.described
    assert lines[0].startswith(f"aot: error: -o {out}: it says where to build a recipe") and "a build directory" in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize(("arguments", "message"), [
    (("-s", "batch=1", "-s", "batch=2"), "dim 'batch' given twice (batch=1 and batch=2): give each dim once, with all its sizes (-s batch=1,2)"),
    (("-s", "=1"), "'=1' is not DIM=SIZE[,SIZE...]"),
    (("-s", " =1,2"), "is not DIM=SIZE[,SIZE...]"),
])
def test_a_grid_option_that_would_be_misread_is_refused(tmp_path, arguments, message):
    result = run_aot("bench", tmp_path, *arguments)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--shape" in lines[0] and message in lines[0], result.stderr


def test_a_size_the_build_cannot_take_is_refused_before_any_runner_starts(cli, tiny_build, monkeypatch):
    import aot.bench.driver

    monkeypatch.setattr(aot.bench.driver, "_hosts", lambda *arguments: pytest.fail("a runner started"))
    result = cli("bench", tiny_build, "-s", "batch=1", "--runs", "1", "--warmup", "0", "--new-tokens", "3")
    assert result.exit_code == 2 and "--new-tokens 3: applies to a decoder build" in result.stderr, result.described
    result = cli("bench", tiny_build, "-s", "sequence=8,513", "--runs", "1", "--warmup", "0")
    assert result.exit_code == 2, result.described
    assert "--shape sequence=513: 513 is above the model's max_position_embeddings 512 (BertConfig)" in result.stderr, result.described
