"""CUDA graph buckets in the saved module: bucket choice, padding and slicing (on the CPU), refusal, and the build's proof.

On the CPU the buckets pad and slice without capturing, which is exactly the path whose numbers
the captured graphs replay; the capture itself is exercised where CUDA is (the last test).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

from aot.builder.spine import build
from aot.errors import ExportError, RecipeError, ValidationError
from aot.recipe.load import load_recipe

BUCKETS = {"batch": [1, 4, 8], "sequence": [16, 32]}
RECIPE = """\
model:
  config: {model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 64, vocab_size: 128}
  class: BertModel
  seed: 0
  device: DEVICE
inputs:
  dims:
    batch: {size: 2, dynamic: true, max: 16}
    sequence: {size: 8, dynamic: true, max: 64}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
    - {name: attention_mask, shape: [batch, sequence]}
    - {name: token_type_ids, shape: [batch, sequence]}
validate:
  shapes:
    - {batch: 1, sequence: 5}
    - {batch: 3, sequence: 12}
    - {batch: 5, sequence: 40}
export:
  onnx: false
  graph_module:
    cuda_graphs: {batch: [1, 4, 8], sequence: [16, 32]}
"""
FACTORY = """\
model:
  factory: tests.models:FACTORY
inputs:
  dims:
    batch: {size: 2, dynamic: true, max: 16}
    sequence: {size: 8, dynamic: true, max: 64}
  tensors:
    - {name: input_ids, shape: [batch, sequence], high: 64}
    - {name: attention_mask, shape: [batch, sequence]}
validate:
  shapes:
    - {batch: 3, sequence: 12}
export:
  onnx: false
  graph_module:
    cuda_graphs: {batch: [4], sequence: [16]}
"""


def _build(tmp_path: Path, text: str, name: str = "buckets") -> Path:
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(text)
    return Path(build(recipe, tmp_path / name).output)


def _load(directory: Path, **options):
    return runpy.run_path(str(directory / "graph_module" / "module.py"))["load"](directory / "graph_module", **options)


def _inputs(batch: int, sequence: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    mask = torch.ones(batch, sequence, dtype=torch.int64)
    mask[0, sequence // 2:] = 0  # a row padded by its user, inside the bucket's own padding
    inputs = {"input_ids": torch.randint(0, 128, (batch, sequence), generator=generator), "attention_mask": mask,
              "token_type_ids": torch.zeros(batch, sequence, dtype=torch.int64)}
    return {name: value.to(device) for name, value in inputs.items()}


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("cuda-graphs"), RECIPE.replace("DEVICE", "cpu"))


@pytest.mark.artifact
def test_the_saved_module_names_its_buckets_and_axes(bucketed):
    source = (bucketed / "graph_module" / "module.py").read_text()
    assert "class CudaGraphBuckets" in source and "CUDA_GRAPHS = " in source
    model = _load(bucketed)
    assert type(model).__name__ == "CudaGraphBuckets"
    assert model.buckets == BUCKETS
    assert model.input_axes["attention_mask"] == {0: "batch", 1: "sequence"}
    assert model.output_axes == [{0: "batch", 1: "sequence"}, {0: "batch"}]  # last_hidden_state, pooler_output
    assert not next(model.parameters()).is_cuda, "a CPU build stays on the CPU"


def test_a_call_takes_the_smallest_bucket_that_holds_it(bucketed):
    model = _load(bucketed)
    assert model.bucket_for({"batch": 1, "sequence": 5}) == (1, 16)
    assert model.bucket_for({"batch": 5, "sequence": 100 // 4}) == (8, 32)
    assert model.bucket_for({"batch": 8, "sequence": 32}) == (8, 32)
    assert model.bucket_for({"batch": 9, "sequence": 5}) is None, "beyond the largest: uncaptured"
    padded = model.padded(_inputs(3, 12), (4, 16))
    assert padded["input_ids"].shape == (4, 16) and int(padded["attention_mask"][3].sum()) == 0
    assert torch.equal(padded["input_ids"][:3, :12], _inputs(3, 12)["input_ids"])


@pytest.mark.parametrize("batch, sequence", [(1, 5), (3, 12), (5, 25), (8, 32), (9, 40)])
def test_padded_into_a_bucket_the_real_tokens_get_the_model_s_outputs(bucketed, batch, sequence):
    model = _load(bucketed)
    inputs = _inputs(batch, sequence)
    assert model.bucket_for(model.sizes_of(inputs)) != (batch, sequence) or (batch, sequence) == (8, 32)
    with torch.no_grad():
        expected = model.model(**inputs)
        got = model(**inputs)
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].shape == expected[name].shape, name
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-5, msg=name)


def test_padding_that_changes_the_answer_fails_the_build(tmp_path):
    with pytest.raises(ValidationError, match="graph_module"):
        _build(tmp_path, FACTORY.replace("FACTORY", "unmasked_mean_embedding"))


def test_an_uncapturable_graph_is_refused_naming_its_node(tmp_path):
    with pytest.raises(ExportError, match=r"cuda_graphs: node 'nonzero' sizes its output from the data: a CUDA graph cannot capture it"):
        _build(tmp_path, FACTORY.replace("FACTORY", "counts_its_tokens"))


@pytest.mark.parametrize("edit, message", [
    ("cuda_graphs: {batch: [1, 4, 8], sequence: [16, 32]}", None),
    ("cuda_graphs: {width: [4]}", "'width' is no dynamic dim under inputs.dims"),
    ("cuda_graphs: {batch: [1, 40]}", "40 lies outside dim 'batch' (1 to 16)"),
])
def test_buckets_are_checked_against_the_dims(tmp_path, edit, message):
    recipe = tmp_path / "check.yaml"
    recipe.write_text(RECIPE.replace("DEVICE", "cpu").replace("cuda_graphs: {batch: [1, 4, 8], sequence: [16, 32]}", edit))
    if message is None:
        assert load_recipe(recipe).recipe.export.graph_module.cuda_graphs == BUCKETS
        return
    with pytest.raises(RecipeError) as raised:
        load_recipe(recipe)
    assert "check.yaml:22: export.graph_module.cuda_graphs." in str(raised.value) and message in str(raised.value), raised.value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_each_bucket_replays_a_captured_graph(tmp_path):
    directory = _build(tmp_path, RECIPE.replace("DEVICE", "cuda"))
    model = _load(directory, capture="all")  # a CUDA build's model loads onto its device
    assert next(model.parameters()).is_cuda
    assert len(model.graphs) == 6, "every bucket captured at load"
    for batch, sequence in [(1, 5), (3, 12), (8, 32)]:
        inputs = _inputs(batch, sequence, "cuda")
        with torch.no_grad():
            expected, got = model.model(**inputs), model(**inputs)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-4, rtol=1e-4, msg=name)
