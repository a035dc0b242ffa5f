"""``generation.calibration``: the recipe's texts as the decoder step's prefills, for passes that fit to data (GPTQ)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aot.builder.prompts import calibration_prompts
from aot.decoding.calibration import calibration_inputs
from aot.decoding.fidelity import tokenized_prompts
from aot.decoding.keyword_step import DecoderStep
from aot.models import load_tokenizer
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.decoding.zoo import decoder

RECIPES = Path(__file__).parents[2] / "recipes"
GPTQ_PASS = "quantize_linear_weights: {bits: 4, group_size: 32, method: gptq}"


@pytest.fixture
def gptq_recipe(tmp_path) -> Path:
    shutil.copytree(RECIPES / "data", tmp_path / "data")
    text = (RECIPES / "llama_int4.yaml").read_text()
    assert "quantize_linear_weights: {bits: 4, group_size: 32}" in text and "  fidelity:" in text, "precondition: the int4 recipe"
    text = text.replace("quantize_linear_weights: {bits: 4, group_size: 32}", GPTQ_PASS)
    text = text.replace("  fidelity:", "  calibration:\n    texts: data/sentences.txt\n    max_texts: 48\n  fidelity:", 1)
    path = tmp_path / "gptq.yaml"
    path.write_text(text)
    return path


def test_texts_become_prefills_with_an_empty_past_under_the_steps_input_names(gptq_recipe):
    flat = decoder("llama")
    step = DecoderStep(flat.model)
    tokenizer = load_tokenizer(load_recipe(gptq_recipe).tokenizer)
    lines = ["The train was late again.", "a", "Preheat the oven before you put the bread in, then wait."]

    made = calibration_inputs(step, tokenized_prompts(lines, tokenizer, max_tokens=9))

    assert len(made) == 2, "a text under two tokens is left out"
    for inputs, line in zip(made, (lines[0], lines[2])):
        assert list(inputs) == step.input_names
        ids = inputs["input_ids"]
        assert ids.tolist()[0] == tokenizer(line, add_special_tokens=False)["input_ids"][:9]
        assert torch.equal(inputs["attention_mask"], torch.ones_like(ids))
        assert torch.equal(inputs["position_ids"], torch.arange(ids.shape[1])[None])
        pasts = [tensor for name, tensor in inputs.items() if name.startswith("past_key_values")]
        assert len(pasts) == 2 * len(flat.past_layout.heads_and_dims) and all(past.shape[2] == 0 for past in pasts)
    assert made[1]["input_ids"].shape[1] == 9, "cut to max_tokens"


def test_the_recipes_texts_are_cut_to_its_limits(gptq_recipe):
    plan = plan_build(load_recipe(gptq_recipe, overrides=["generation.calibration.max_tokens=9"])).passes.calibration
    assert (plan.spec.max_texts, plan.spec.max_tokens) == (48, 9) and len((RECIPES / "data" / "sentences.txt").read_text().splitlines()) > 48  # precondition
    prompts = calibration_prompts(plan)
    assert len(prompts) == 48 and max(ids.shape[1] for ids in prompts) == plan.spec.max_tokens


@pytest.mark.parametrize("key", ["generation.calibration.texts", "generation.fidelity.prompts"])
def test_aot_check_refuses_texts_too_short_to_use_as_the_build_would(gptq_recipe, cli, key):
    assert cli("check", gptq_recipe).exit_code == 0  # precondition
    (gptq_recipe.parent / "data" / "short.txt").write_text("a\nb\n")  # one token each: nothing to predict
    # the build raises the same error from the same function (aot.builder.prompts), after loading the model
    result = cli("check", gptq_recipe, "--set", f"{key}=data/short.txt")
    assert result.exit_code == 2 and f"--set {key}: no " in result.stderr and "two tokens or more" in result.stderr, result.described


@pytest.mark.parametrize("edit, key, message", [
    (lambda text: text.replace("  calibration:\n    texts: data/sentences.txt\n    max_texts: 48\n", ""),
     "passes[2]", "fits to calibration texts: add generation.calibration"),
    (lambda text: text.replace("texts: data/sentences.txt", "texts: data/absent.txt"),
     "generation.calibration.texts", "texts file not found"),
    (lambda text: text.replace("  cache: true\n", "  cache: false\n"), "generation.calibration", "needs generation.cache: true"),
])
def test_a_recipe_that_cannot_calibrate_is_refused_naming_the_key(gptq_recipe, cli, edit, key, message):
    gptq_recipe.write_text(edit(gptq_recipe.read_text()))
    out = gptq_recipe.parent / "out"
    result = cli("build", gptq_recipe, "-o", out)
    assert result.exit_code == 2, result.described
    assert key in result.stderr and message in result.stderr, result.stderr
    assert not out.exists()


def test_calibration_texts_no_pass_fits_to_are_not_even_read(gptq_recipe):
    text = gptq_recipe.read_text().replace(GPTQ_PASS, "quantize_linear_weights: {bits: 4, group_size: 32}")
    gptq_recipe.write_text(text)
    assert "calibration:" in text, "precondition: the recipe names texts"
    assert plan_build(load_recipe(gptq_recipe)).passes.calibration is None


@pytest.mark.full  # three builds of llama_int4.yaml at its shipped size: GPTQ's gain over rounding shows there
def test_a_gptq_build_is_byte_reproducible_and_closer_to_eager_than_rounding_to_nearest(gptq_recipe, cli):
    nearest_recipe = gptq_recipe.with_name("nearest.yaml")
    nearest_recipe.write_text(gptq_recipe.read_text().replace(GPTQ_PASS, "quantize_linear_weights: {bits: 4, group_size: 32}"))
    manifests = {}
    for method, recipe in (("gptq", gptq_recipe), ("nearest", nearest_recipe)):
        result = cli("build", recipe, "-o", gptq_recipe.parent / method)
        assert result.exit_code == 0, result.described
        manifests[method] = json.loads((gptq_recipe.parent / method / "manifest.json").read_text())
    again = gptq_recipe.parent / "again"
    completed = subprocess.run([sys.executable, "-m", "aot.cli", "build", str(gptq_recipe), "-o", str(again)],
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr

    artifacts = manifests["gptq"]["artifacts"]
    assert "model.onnx" in artifacts and artifacts != manifests["nearest"]["artifacts"], "precondition: other codes"
    assert json.loads((again / "manifest.json").read_text())["artifacts"] == artifacts, "the same bytes in another process"
    assert "aot_calibration_inputs" not in (gptq_recipe.parent / "gptq" / "graph_module" / "module.py").read_text()
    kl = {method: {entry["artifact"]: entry["metrics"]["kl_mean"] for entry in manifest["generation"] if "metrics" in entry}
          for method, manifest in manifests.items()}
    assert set(kl["gptq"]) == {"onnx", "graph_module"}, kl
    for artifact, value in kl["gptq"].items():
        assert value < kl["nearest"][artifact], kl
