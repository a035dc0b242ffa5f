"""``aot build`` of a recipe with ``generation.cache``: the KV-cache step, validated by generation, saved twice."""

from __future__ import annotations

import json
import runpy
import textwrap

import onnx
import pytest
import torch

from aot.builder.spine import build
from aot.decoding.generation_check import ForcedStep, check_generation, eager_tokens, prompts
from aot.decoding.greedy import greedy_generate
from aot.decoding.names import input_names, output_names
from aot.errors import RecipeError
from aot.models import load_model
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build

_TINY = {
    "gpt2": "{model_type: gpt2, n_embd: 64, n_layer: 2, n_head: 4, vocab_size: 128, n_positions: 128, initializer_range: 0.2}",
    "llama": "{model_type: llama, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
    "num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 128, initializer_range: 0.2}",
}
_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def _recipe(tmp_path, family: str, extra: str = "", frontend: str = "export") -> str:
    path = tmp_path / f"{family}.yaml"
    path.write_text(textwrap.dedent(f"""\
        description: tiny {family} with its KV cache
        model:
          config: {_TINY[family]}
          class: {_CLASSES[family]}
          seed: 0
          attn_implementation: sdpa
        trace: {{frontend: {frontend}}}
        passes: [dead_code_elimination]
        generation: {{cache: true, new_tokens: 12, prompt_lengths: [3, 6]}}
        """) + extra)
    return str(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each tiny family built once: {family: (recipe path, output directory, report)}."""
    root = tmp_path_factory.mktemp("decoders")
    results = {}
    for family in _TINY:
        recipe = _recipe(root, family)
        report = build(recipe, root / f"out_{family}")
        results[family] = (recipe, root / f"out_{family}", report)
    return results


@pytest.mark.artifact
@pytest.mark.parametrize("family", list(_TINY))
def test_both_artifacts_generate_eagers_tokens_at_every_prompt(built, family):
    _, directory, report = built[family]
    assert report.ok
    manifest = json.loads((directory / "manifest.json").read_text())
    generation = manifest["generation"]
    assert len(generation) == 2 * 4, generation  # two artifacts x (2 lengths x batch 1 and 2)
    assert {(g["artifact"], g["prompt"].split(",")[1].strip()) for g in generation} == {
        (artifact, batch) for artifact in ("onnx", "graph_module") for batch in ("batch 1", "batch 2")
    }
    assert all(g["ok"] and g["new_tokens"] == 12 for g in generation)
    shapes = {v["shape"] for v in manifest["validation"] if v["artifact"] == "onnx"}
    assert any("seen=0" in shape for shape in shapes) and any("sequence=1," in shape for shape in shapes), shapes


@pytest.mark.parametrize("family", list(_TINY))
def test_onnx_model_has_the_decoder_with_past_names(built, family):
    recipe, directory, _ = built[family]
    model = onnx.load(str(directory / "model.onnx"), load_external_data=False)
    onnx.checker.check_model(str(directory / "model.onnx"), full_check=True)
    assert [i.name for i in model.graph.input] == input_names(2, with_position_ids=True)  # both take position_ids
    assert [o.name for o in model.graph.output] == output_names(2)
    past = model.graph.input[3].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in past] == ["batch", 2 if family == "llama" else 4, "past_sequence", 16]


@pytest.mark.artifact
def test_saved_module_generates_with_torch_alone(built):
    recipe, directory, _ = built["llama"]
    model = runpy.run_path(str(directory / "graph_module" / "module.py"))["load"]()
    assert hasattr(model, "generate"), "a decoder step's module.py offers generate()"
    step = load_model(plan_build(load_recipe(recipe)).model)
    prompt = prompts([6], step.config.vocab_size, seed=7)[1]  # batch 2, left padded: other ids than the build's
    expected = eager_tokens(step.causal_lm, prompt, 20)
    assert len(set(expected[0, 6:].tolist())) > 3, "precondition: the tiny model's tokens vary"
    with torch.no_grad():
        actual = model.generate(prompt.input_ids, prompt.attention_mask, max_new_tokens=20)
    assert torch.equal(actual, expected)


@pytest.mark.artifact
def test_a_wrong_step_is_named_at_the_first_token_it_changes():
    step = load_model(plan_build(load_recipe(_recipe_path_for_check())).model)
    checked = prompts([5], step.config.vocab_size, seed=0)
    references = [eager_tokens(step.causal_lm, prompt, 10) for prompt in checked]
    layout = step.decoder.past_layout

    def forgetful(input_ids, attention_mask, new_tokens):  # zeroes the oldest cached token: a cache that forgets
        from aot.decoding.greedy import greedy_generate

        def step_forgetting_the_first(*tensors):
            logits, *present = step.decoder(*tensors)
            return [logits, *[torch.cat([torch.zeros_like(t[:, :, :1]), t[:, :, 1:]], dim=2) for t in present]]

        return greedy_generate(step_forgetting_the_first, input_ids, attention_mask, new_tokens, past_layout=layout)

    results = check_generation("onnx", forgetful, checked, references, 10)
    assert [r.ok for r in results] == [False, False], results
    assert "tokens differ from eager generate at new token" in results[0].message
    assert "prompt 'length 5, batch 1'" in results[0].message

    def step_forgetting_the_first(*tensors):
        logits, *present = step.decoder(*tensors)
        return [logits, *[torch.cat([torch.zeros_like(t[:, :, :1]), t[:, :, 1:]], dim=2) for t in present]]

    forced = ForcedStep(step_forgetting_the_first, layout, atol=1e-4, rtol=1e-4)
    judged = check_generation("onnx", forgetful, checked, references, 10, forced)
    assert [r.ok for r in judged] == [False, False] and "not a tie" in judged[0].message, judged


def test_a_tie_between_two_tokens_is_not_a_failure_but_a_wrong_token_is():
    """A step whose rival token scores eager's pick plus 1e-6 takes the rival: a tie within atol, so it passes."""
    step = load_model(plan_build(load_recipe(_recipe_path_for_check())).model)
    checked = prompts([5], step.config.vocab_size, seed=0)[:1]
    references = [eager_tokens(step.causal_lm, prompt, 10) for prompt in checked]
    picked = int(references[0][0, 5])
    rival = (picked + 1) % step.config.vocab_size
    layout = step.decoder.past_layout

    def step_preferring_the_rival(*tensors):
        logits, *present = step.decoder(*tensors)
        logits = logits.clone()
        logits[..., rival] = logits[..., picked] + 1e-6
        return [logits, *present]

    def generate(input_ids, attention_mask, new_tokens):
        return greedy_generate(step_preferring_the_rival, input_ids, attention_mask, new_tokens, past_layout=layout)

    assert not torch.equal(generate(checked[0].input_ids, checked[0].attention_mask, 10), references[0]), "precondition: the texts differ"
    tied = check_generation("graph_module", generate, checked, references, 10, ForcedStep(step_preferring_the_rival, layout, 1e-4, 1e-4))
    assert tied[0].ok and "ties within atol+rtol" in tied[0].message and "new token 1 of row 0" in tied[0].message, tied
    exact = check_generation("graph_module", generate, checked, references, 10, ForcedStep(step_preferring_the_rival, layout, 0.0, 0.0))
    assert not exact[0].ok and "not a tie: fed eager's tokens, at new token 1 of row 0" in exact[0].message, exact


def _recipe_path_for_check(cache={}):  # noqa: B006 (one tiny recipe file per session)
    if "path" not in cache:
        import tempfile
        from pathlib import Path

        cache["path"] = _recipe(Path(tempfile.mkdtemp()), "gpt2")
    return cache["path"]


@pytest.mark.parametrize(
    ("extra", "frontend", "message"),
    [
        ("inputs: {tensors: [{name: input_ids, shape: [2, 3]}]}\n", "export", "inputs: generation.cache makes the step's inputs"),
    ],
)
def test_recipe_errors_name_the_key(tmp_path, extra, frontend, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(_recipe(tmp_path, "gpt2", extra, frontend))


def test_a_model_without_a_cache_is_refused_at_its_class(tmp_path):
    path = tmp_path / "distilbert.yaml"
    path.write_text(
        "model: {config: {model_type: distilbert, dim: 32, n_layers: 1, n_heads: 2, hidden_dim: 37},"
        " class: DistilBertModel}\ntrace: {frontend: export}\ngeneration: {cache: true}\n"
    )
    loaded = load_recipe(path)
    with pytest.raises(RecipeError, match="model.class: generation.cache needs a causal LM"):
        load_model(plan_build(loaded).model)


@pytest.mark.artifact
def test_validating_the_directory_again_generates_again(built):
    from aot.validate.directory import validate_directory

    recipe, directory, _ = built["gpt2"]
    report = validate_directory(directory)
    assert report.ok
    assert {g.artifact for g in report.generation} == {"onnx", "graph_module"} and len(report.generation) == 8
    assert all(g.ok for g in report.generation)


_FAMILIES = {  # (class, config, attention): the decoder families the issue names, tiny
    "qwen2": ("Qwen2ForCausalLM", "{model_type: qwen2, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
              "num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 128, initializer_range: 0.2}", "sdpa"),
    "qwen3": ("Qwen3ForCausalLM", "{model_type: qwen3, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
              "num_key_value_heads: 2, head_dim: 16, vocab_size: 128, max_position_embeddings: 128, initializer_range: 0.2}", "sdpa"),
    "phi3": ("Phi3ForCausalLM", "{model_type: phi3, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
             "num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 128, initializer_range: 0.2, pad_token_id: 0}", "sdpa"),
    # Gemma 2 and 3 alternate sliding-window and full layers; Gemma 2 has no SDPA attention in transformers.
    # At initializer_range 0.2 their tiny models repeat one token: they keep the default, at which tokens vary.
    "gemma2": ("Gemma2ForCausalLM", "{model_type: gemma2, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
               "num_key_value_heads: 2, head_dim: 16, vocab_size: 128, max_position_embeddings: 128, sliding_window: 8}", "eager"),
    "gemma3": ("Gemma3ForCausalLM", "{model_type: gemma3_text, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
               "num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, vocab_size: 128, max_position_embeddings: 128, "
               "sliding_window: 8}", "sdpa"),
}


@pytest.mark.full  # a zoo of decoder families, ten builds; the shipped decoders' tiny builds run in the artifact tier
@pytest.mark.parametrize("frontend", ["export", "fx"])
@pytest.mark.parametrize("family", list(_FAMILIES))
def test_decoder_family_builds_and_generates_eagers_tokens(tmp_path, family, frontend):
    model_class, config, attention = _FAMILIES[family]
    recipe = tmp_path / f"{family}.yaml"
    recipe.write_text(
        f"model: {{config: {config}, class: {model_class}, attn_implementation: {attention}}}\n"
        f"trace: {{frontend: {frontend}}}\ngeneration: {{cache: true, new_tokens: 16, prompt_lengths: [5, 11]}}\n"
    )
    step = load_model(plan_build(load_recipe(recipe)).model)
    prompt = prompts([11], step.config.vocab_size, seed=0)[0]
    assert len(set(eager_tokens(step.causal_lm, prompt, 16)[0, 11:].tolist())) > 4, "precondition: the tokens vary"
    report = build(recipe, tmp_path / "out")
    assert report.ok and len(report.generation) == 8 and all(g.ok for g in report.generation), report.generation
    past_axes = {
        i.name: i.type.tensor_type.shape.dim[2].dim_param
        for i in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.input
        if i.name.startswith("past_key_values.")
    }
    windowed = family.startswith("gemma")  # a sliding-window layer's past is named apart from a full layer's
    assert ("past_window_sequence" in past_axes.values()) == windowed, past_axes


@pytest.mark.artifact
def test_last_logits_only_keep_one_position_and_the_same_tokens(tmp_path):
    recipe = _recipe(tmp_path, "llama")
    text = open(recipe).read().replace("generation: {cache: true,", "generation: {cache: true, logits: last,")
    assert "logits: last" in text, "precondition: the recipe asks for the last logits only"
    open(recipe, "w").write(text)
    report = build(recipe, tmp_path / "out")
    assert report.ok and all(g.ok for g in report.generation) and len(report.generation) == 8
    logits = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.output[0]
    assert [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim] == ["batch", 1, 128]
