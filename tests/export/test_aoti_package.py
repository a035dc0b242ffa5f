"""The AOTInductor package (``export.aoti``) on the CPU: built, validated in its own process, loadable with torch alone.

One tiny BERT build (about 20 s, most of it the C++ compiler) serves every test but the refusals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aot.builder.spine import build
from aot.errors import ExportError, RecipeError
from aot.export.aoti_package import AOTI_FILE, AotiCrash, AotiProcess
from aot.recipe.load import load_recipe
from aot.validate.directory import validate_directory
from tests.conftest import TINY_BERT
from tests.log_messages import messages_of

RECIPE = TINY_BERT + """\
export:
  onnx: false
  aoti: true
"""
SHAPES = ["batch=2,sequence=8", "batch=1,sequence=5", "batch=3,sequence=12"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("aoti")
    (directory / "aoti.yaml").write_text(RECIPE)
    return Path(build(directory / "aoti.yaml", directory / "out").output)


def _inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    mask = torch.ones(batch, sequence, dtype=torch.int64)
    mask[0, sequence // 2:] = 0
    return {"input_ids": torch.randint(0, 128, (batch, sequence), generator=generator), "attention_mask": mask}


@pytest.mark.artifact
def test_manifest_lists_the_package_and_says_it_is_not_reproducible(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    assert (built / AOTI_FILE).is_file()
    assert AOTI_FILE in manifest["artifacts"]
    assert manifest["aoti"]["byte_reproducible"] is False
    assert "serialization_id" in manifest["aoti"]["why_not_reproducible"]
    assert manifest["aoti"]["compiled_for"].startswith("cpu: ")
    assert manifest["aoti"]["inputs"] == ["input_ids", "attention_mask"]


@pytest.mark.artifact
def test_build_validated_the_package_at_every_shape(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    checked = [entry for entry in manifest["validation"] if entry["artifact"] == "aoti"]
    assert [entry["shape"] for entry in checked] == SHAPES
    assert all(entry["ok"] and "its own process" in entry["source"] for entry in checked)
    assert max(entry["max_abs"] for entry in checked) < 1e-4


@pytest.mark.artifact
def test_package_runs_with_torch_alone_and_matches_the_graph_module(built: Path, tmp_path: Path) -> None:
    """A fresh interpreter that imports torch only loads the package; its outputs match module.py's at an unvalidated shape."""
    inputs = _inputs(3, 21)
    torch.save(inputs, tmp_path / "inputs.pt")
    script = (
        "import sys, torch\n"
        f"run = torch._inductor.aoti_load_package({str(built / AOTI_FILE)!r})\n"
        f"outputs = run(**torch.load({str(tmp_path / 'inputs.pt')!r}))\n"
        f"torch.save(outputs, {str(tmp_path / 'outputs.pt')!r})\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] in ('aot', 'transformers', 'onnx', 'onnxruntime'))\n"
        "print(loaded)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip().splitlines()[-1] == "[]"
    outputs = torch.load(tmp_path / "outputs.pt")
    assert set(outputs) == {"last_hidden_state", "pooler_output"}
    from aot import export

    module = export.load_standalone(built / "graph_module")
    with torch.no_grad():
        expected = module(**inputs)
    for name, value in outputs.items():
        assert value.shape == expected[name].shape
        torch.testing.assert_close(value, expected[name], atol=1e-5, rtol=1e-4)


@pytest.mark.artifact
def test_validate_directory_checks_the_package_again(built: Path) -> None:
    report = validate_directory(built)
    checked = [comparison for comparison in report.validation if comparison.artifact == "aoti"]
    assert [comparison.shape for comparison in checked] == SHAPES
    assert all(comparison.ok for comparison in checked)


@pytest.mark.artifact
def test_a_child_that_dies_is_reported_with_its_signal(built: Path) -> None:
    with AotiProcess(built / AOTI_FILE) as package, messages_of("aot.export.aoti_package") as messages:
        assert package.run(_inputs(1, 4))["last_hidden_state"].shape == (1, 4, 32)
        os.kill(package._child.pid, signal.SIGSEGV)
        with pytest.raises(AotiCrash, match=r"model.pt2: the process that runs it died \(signal SIGSEGV\)"):
            package.run(_inputs(1, 4))
    logged = [message for message in messages if "the child's stderr ended with" in message]
    assert logged and "Fatal Python error: Segmentation fault" in logged[0], "the child's own account is logged"


@pytest.mark.artifact
def test_a_file_that_is_no_package_fails_to_load_naming_it(tmp_path: Path) -> None:
    bogus = tmp_path / "model.pt2"
    bogus.write_bytes(b"not a zip archive")
    with pytest.raises(ExportError, match=r"model.pt2: loading .*model.pt2"):
        AotiProcess(bogus)


def test_aoti_is_off_unless_asked_and_takes_a_bare_boolean(tmp_path: Path) -> None:
    (tmp_path / "off.yaml").write_text(RECIPE.replace("  aoti: true\n", ""))
    (tmp_path / "on.yaml").write_text(RECIPE)
    assert load_recipe(tmp_path / "off.yaml").recipe.export.aoti.enabled is False
    assert load_recipe(tmp_path / "on.yaml").recipe.export.aoti.enabled is True
    (tmp_path / "typo.yaml").write_text(RECIPE.replace("  aoti: true\n", "  aoti: {enabled: true, autotune: true}\n"))
    with pytest.raises(RecipeError, match="autotune"):
        load_recipe(tmp_path / "typo.yaml")


@pytest.mark.artifact
def test_bench_times_the_package_in_a_process_of_its_own(built: Path) -> None:
    from aot.bench import bench

    report = bench(built, {"batch": [2], "sequence": [16]}, runs=3, warmup=1, threads=1, gap_ms=0)
    assert set(report.pids) == {"eager", "graph_module", "aoti"}
    assert report.device == "cpu" and report.cpu
    assert len(set(report.pids.values())) == 3
    figures = {runner.runner: runner for runner in report.shapes[0].runners}
    assert figures["aoti"].median_ms > 0 and figures["aoti"].peak_mib is not None


@pytest.mark.artifact
def test_cuda_peers_are_refused_for_a_cpu_build(built: Path) -> None:
    from aot.bench import bench
    from aot.bench.peer_groups import peer_names

    assert "torch_compile" in peer_names("cuda")
    with pytest.raises(RecipeError, match="--peers torch_compile: the CUDA peers are for a CUDA build"):
        bench(built, runs=1, peers=("torch_compile",))


@pytest.mark.artifact
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_package_is_built_and_validated_on_the_gpu(tmp_path: Path) -> None:
    (tmp_path / "cuda.yaml").write_text(RECIPE.replace("  seed: 0\n", "  seed: 0\n  device: cuda\n"))
    built = Path(build(tmp_path / "cuda.yaml", tmp_path / "out").output)
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["aoti"]["compiled_for"].startswith("cuda: ")
    checked = [entry for entry in manifest["validation"] if entry["artifact"] == "aoti"]
    assert [entry["shape"] for entry in checked] == SHAPES and all(entry["ok"] for entry in checked)


@pytest.mark.artifact
def test_aot_load_runs_the_package_as_the_torch_runtime_runs_module_py(built: Path, tiny_build: Path) -> None:
    from aot.run.built_model import load

    package, module = load(built, "aoti"), load(built, "torch")
    assert package.runtime == "aoti"
    inputs = _inputs(2, 9)
    got, want = package(inputs), module(inputs)
    assert set(got) == set(want) == {"last_hidden_state", "pooler_output"}
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4)
    with pytest.raises(RecipeError, match="no AOTInductor package"):
        load(tiny_build, "aoti")
