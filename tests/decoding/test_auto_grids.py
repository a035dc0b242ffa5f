"""A decoder recipe whose ``quantize_linear_weights`` chooses its grids (``auto: true``): refused without a gate to
keep, built with one, the choice and its figures in the manifest, the build's own gate met."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aot.export.graph_module_artifact import load as load_graph_module
from aot.passes._weight_grids import layer_kind
from aot.recipe.load import load_recipe
from aot.runtime import WeightOnlyLinear
from tests.test_shipped_recipes import less_work, set_options  # the fidelity gate's code path on fewer prompts and tokens

RECIPES = Path(__file__).parents[2] / "recipes"
FIXED_PASS = "quantize_linear_weights: {bits: 4, group_size: 32}"
AUTO_PASS = "quantize_linear_weights: {auto: true}"


@pytest.fixture
def auto_recipe(tmp_path) -> Path:
    shutil.copytree(RECIPES / "data", tmp_path / "data")
    text = (RECIPES / "llama_int4.yaml").read_text()
    assert FIXED_PASS in text and "  fidelity:" in text, "precondition: the int4 recipe"
    text = text.replace(FIXED_PASS, AUTO_PASS)
    text = text.replace("num_hidden_layers: 6", "num_hidden_layers: 2")
    text = text.replace("  fidelity:", "  calibration:\n    texts: data/sentences.txt\n    max_texts: 8\n    max_tokens: 24\n  fidelity:", 1)
    path = tmp_path / "auto.yaml"
    path.write_text(text)
    return path


def test_auto_without_a_fidelity_gate_is_refused_naming_the_pass(auto_recipe, cli):
    text = auto_recipe.read_text()
    gate = text[text.index("  fidelity:"):]
    auto_recipe.write_text(text.replace(gate, ""))
    out = auto_recipe.parent / "out"
    result = cli("build", auto_recipe, "-o", out)
    assert result.exit_code == 2, result.described
    assert "passes[2]" in result.stderr and "chooses grids that keep the fidelity gate" in result.stderr, result.stderr
    assert not out.exists()


@pytest.mark.artifact
def test_an_auto_build_records_its_choice_and_meets_its_gate(auto_recipe, cli):
    out = auto_recipe.parent / "out"
    result = cli("build", auto_recipe, "-o", out, *set_options(less_work(load_recipe(auto_recipe))))
    assert result.exit_code == 0, result.described
    manifest = json.loads((out / "manifest.json").read_text())
    record = next(record for record in manifest["passes"] if record["name"] == "quantize_linear_weights")
    auto = record["findings"]["auto"]
    layers = "decoder.model.model.layers.*"
    assert set(auto["kinds"]) == {f"{layers}.self_attn.merged_q_proj_k_proj_v_proj", f"{layers}.self_attn.o_proj",
                                  f"{layers}.mlp.merged_gate_proj_up_proj", f"{layers}.mlp.down_proj", "decoder.model.lm_head"}
    assert list(auto["kinds"][f"{layers}.mlp.down_proj"]["grids"]) == ["int4_g32", "int8"], "1376 inputs: no groups of 64 or 128"
    assert auto["texts"] == 8 and auto["target"] == {"kl_mean": 0.01, "kl_max": 0.025, "top1_agreement": 0.65}
    assert auto["bytes"] == sum(kind["grids"][kind["chosen"]]["bytes"] for kind in auto["kinds"].values())
    assert auto["bytes"] < auto["float32_bytes"] / 3
    assert all(entry["ok"] for entry in manifest["generation"] if "metrics" in entry), manifest["generation"]

    graph_module = load_graph_module(out / "graph_module")
    chosen = {kind: value["chosen"] for kind, value in auto["kinds"].items()}
    rounded = {name: module for name, module in graph_module.named_modules() if type(module).__name__ == WeightOnlyLinear.__name__}
    assert len(rounded) == 2 * 4 + 1, "precondition: every linear layer rounded"
    for name, module in rounded.items():
        assert (f"int4_g{module.group_size}" if module.bits == 4 else "int8") == chosen[layer_kind(name)], name
