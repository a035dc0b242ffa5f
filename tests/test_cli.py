"""The CLI end to end: exit codes, one-line errors, no partial output, atomic replacement."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_BERT


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        ("model: [unclosed\n", 2, "malformed YAML"),
        (TINY_BERT.replace("  seed: 0\n", "  seed: 0\n  colour: red\n"), 2, "model.colour: unknown key"),
        (TINY_BERT.replace("seed: 0", "seed: [0]"), 2, "model.seed: Input should be a valid integer"),
        (TINY_BERT.replace("  - merge_linears", "  - fuse_everything"), 2, "unknown pass 'fuse_everything'"),
        ("model:\n  pretrained: ./missing-model\n", 2, "pretrained directory not found"),
        (TINY_BERT.replace("name: attention_mask", "name: attention_masks"), 2, "BertModel.forward has no input 'attention_masks'"),
    ],
    ids=["malformed-yaml", "unknown-key", "wrong-type", "unknown-pass", "missing-model-dir", "unknown-input"],
)
def test_bad_recipe_exit_code_and_message(cli, write_recipe, tmp_path, text, code, message):
    output = tmp_path / "out"
    result = cli("build", write_recipe(text), "-o", output)
    assert result.exit_code == code, result.described
    assert message in result.stderr, result.described
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.described
    assert not output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "no staging directory left behind"


NOISY = """\
model:
  factory: tests.models:noisy_linear
inputs:
  dims:
    batch: {size: 2, dynamic: true}
  tensors:
    - {name: x, shape: [batch, 8], dtype: float32}
"""


@pytest.mark.artifact
def test_validation_failure_exit_code_names_output(cli, write_recipe, tmp_path):
    result = cli("build", write_recipe(NOISY), "-o", tmp_path / "out")
    assert result.exit_code == 5, result.described
    assert "graph at batch=2: output 'output' shape (2, 8) max abs error" in result.stderr, result.described
    assert "outputs already diverge right after tracing" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.artifact
def test_build_writes_artifacts_and_manifest(cli, write_recipe, tmp_path):
    output = tmp_path / "out"
    result = cli("build", write_recipe(), "-o", output, "--json")
    assert result.exit_code == 0, result.described
    report = json.loads(result.stdout)
    assert report["ok"]
    manifest = json.loads((output / "manifest.json").read_text())
    assert {"graph_module/module.py", "graph_module/weights.safetensors", "model.onnx"} <= set(manifest["artifacts"])
    assert set(manifest["versions"]) >= {"python", "torch", "transformers", "onnx", "onnxruntime", "aot"}
    shapes = {(v["artifact"], v["shape"]) for v in manifest["validation"]}
    for artifact in ("graph", "graph_module", "onnx"):
        assert len([s for a, s in shapes if a == artifact]) >= 3, shapes
    assert all(v["ok"] for v in manifest["validation"])
    assert manifest["passes"][0]["name"] == "merge_linears" and manifest["passes"][0]["changed"] > 0

    result = cli("validate", output)
    assert result.exit_code == 0, result.described


@pytest.mark.artifact
def test_tampered_weights_fail_validate(cli, write_recipe, tmp_path):
    output = tmp_path / "out"
    assert cli("build", write_recipe(), "-o", output).exit_code == 0
    weights = output / "graph_module" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    result = cli("validate", output)
    assert result.exit_code == 7, result.described
    assert "weights.safetensors" in result.stderr and "sha256" in result.stderr


@pytest.mark.artifact
def test_killed_build_leaves_previous_output_untouched(write_recipe, copy_build, cli, tmp_path):
    recipe, output = write_recipe(), copy_build("out")  # the earlier build: the session's tiny one
    command = [sys.executable, "-m", "aot.cli", "build", str(recipe), "-o", str(output)]
    before = _tree_bytes(output)
    assert "manifest.json" in before

    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = tmp_path / f".out.aot-tmp-{process.pid}"
    deadline = time.monotonic() + 120
    while not (staging / "recipe.yaml").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the build ended before it could be killed mid-way"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _tree_bytes(output) == before

    # The next build cleans the dead build's staging directory.
    result = cli("build", recipe, "-o", output)
    assert result.exit_code == 0, result.described
    assert not staging.exists()


def test_passes_lists_every_registered_pass(cli):
    from aot.passes import registry

    result = cli("passes")
    assert result.exit_code == 0, result.described
    names = [info.name for info in registry.all_passes()]
    assert names, "the registry must not be empty"
    for name in names:
        assert name in result.stdout


def test_passes_json_says_which_passes_need_a_gate(cli):
    from aot.passes import registry

    listed = {item["name"]: item for item in json.loads(cli("passes", "--json").stdout)}
    infos = registry.all_passes()
    assert any(not info.preserves_computation for info in infos) and any(info.reversible for info in infos)  # precondition
    assert {name: (item["reversible"], item["preserves_computation"]) for name, item in listed.items()} == {
        info.name: (info.reversible, info.preserves_computation) for info in infos}


def test_no_option_type_names_a_private_class():
    from aot.passes import registry

    types = [option.type for info in registry.all_passes() for option in info.option_docs]
    assert "dict[str, {bits: Literal[4, 8], group_size: Optional[Literal[32, 64, 128, 256]]}]" in types  # precondition
    assert not [text for text in types if "aot." in text or "._" in text]


def test_passes_lists_the_onnx_lowering_in_the_order_it_runs(cli):
    from aot.export.onnx_lowering import ONNX_LOWERING

    result = cli("passes")
    assert result.exit_code == 0, result.described
    assert len(ONNX_LOWERING) >= 2, "precondition: an order to check"
    lines = [f"  {lowering.name}  [{lowering.form}]  {lowering.summary}" for lowering in ONNX_LOWERING.values()]
    positions = [result.stdout.find(line) for line in lines]
    assert -1 not in positions, [line for line, at in zip(lines, positions) if at == -1]
    assert positions == sorted(positions)
    assert positions[0] > max(result.stdout.find(info_name) for info_name in ("merge_linears", "remove_dropout")), \
        "after the recipe passes"


def test_schema_command_prints_json_schema(cli):
    result = cli("schema")
    assert json.loads(result.stdout)["title"] == "aot recipe"


def test_passes_page_documents_every_registered_pass():
    from pathlib import Path

    from aot.passes import registry

    page = (Path(__file__).parents[1] / "docs" / "passes.md").read_text()
    names = [info.name for info in registry.all_passes()]
    assert names
    missing = [name for name in names if f"\n## {name}\n" not in page]
    assert not missing, f"docs/passes.md lacks {missing}: run python scripts/passes_page.py"


@pytest.mark.artifact
def test_verbose_logs_aots_stages_and_leaves_the_libraries_info_to_debug(write_recipe, tmp_path):
    from tests.conftest import run_aot

    result = run_aot("-v", "build", write_recipe(), "-o", tmp_path / "out")  # a fresh process: logging as a user gets it
    assert result.returncode == 0, result.stderr
    records = [line.split(":", 1)[0].split() for line in result.stderr.splitlines() if line.startswith(("INFO ", "DEBUG "))]
    assert ["INFO", "aot.builder.stages"] in records, result.stderr  # precondition: -v logs the stages
    assert all(name.startswith("aot.") and level == "INFO" for level, name in records), result.stderr
