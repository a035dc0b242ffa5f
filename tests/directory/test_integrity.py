"""`aot validate` and `aot bench` check every file of a build directory before they run anything from it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import rehash_manifest as _rehash
from tests.conftest import run_aot, run_aot_here  # run_aot: where code planted in the directory could run

PAYLOAD_MARK = "aot-test-payload-ran"


def _plant_payload(build: Path, marker: Path) -> None:
    module = build / "graph_module" / "module.py"
    module.write_text(module.read_text() + f"\nopen({str(marker)!r}, 'w').write({PAYLOAD_MARK!r})\n")


def _manifest_sha256(build: Path) -> str:
    return hashlib.sha256((build / "manifest.json").read_bytes()).hexdigest()


def _assert_integrity_failure(result, *fragments: str) -> None:
    assert result.returncode == 7, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aot: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], result.stderr


@pytest.mark.artifact
def test_untouched_build_validates(copy_build):
    build = copy_build()
    result = run_aot_here("validate", build, "--expect-sha256", _manifest_sha256(build))
    assert result.returncode == 0, result.stderr
    assert "files match the manifest" in result.stdout


@pytest.mark.artifact
@pytest.mark.parametrize("command", ["validate", "bench"])
def test_a_payload_in_module_py_never_runs(copy_build, tmp_path, command):
    build, marker = copy_build(), tmp_path / "payload-ran"
    _plant_payload(build, marker)
    extra = ["--runs", "1", "--no-memory"] if command == "bench" else []
    _assert_integrity_failure(run_aot(command, build, *extra), "module.py", "modified after the build")
    assert not marker.exists()


@pytest.mark.artifact
@pytest.mark.parametrize("command", ["validate", "bench"])
def test_a_rehashed_manifest_is_caught_by_the_published_sha256(copy_build, tmp_path, command):
    build, marker = copy_build(), tmp_path / "payload-ran"
    published = _manifest_sha256(build)
    _plant_payload(build, marker)
    _rehash(build, "graph_module/module.py")
    extra = ["--runs", "1", "--no-memory"] if command == "bench" else []
    _assert_integrity_failure(run_aot(command, build, "--expect-sha256", published, *extra), "manifest.json", published)
    assert not marker.exists()


@pytest.mark.artifact
def test_a_swapped_recipe_is_caught_by_the_published_sha256(copy_build, tmp_path):
    build = copy_build()
    published = _manifest_sha256(build)
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["recipe"]["path"] = str(tmp_path / "gone.yaml")  # so the directory's own copy is the one used
    recipe = build / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("  config:", "  factory: subprocess:call\n  factory_kwargs: {args: [touch, x]}\n  cfg:", 1))
    manifest["recipe"]["sha256"] = hashlib.sha256(recipe.read_bytes()).hexdigest()
    (build / "manifest.json").write_text(json.dumps(manifest))
    _rehash(build, "recipe.yaml")
    _assert_integrity_failure(run_aot("validate", build, "--expect-sha256", published), "manifest.json")


@pytest.mark.artifact
def test_paths_outside_the_directory_are_refused(copy_build):
    build = copy_build()
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["artifacts"]["../../etc/hostname"] = {"sha256": "0" * 64, "bytes": 1}
    (build / "manifest.json").write_text(json.dumps(manifest))
    _assert_integrity_failure(run_aot_here("validate", build), "../../etc/hostname", "outside")


@pytest.mark.artifact
def test_a_link_in_place_of_an_artifact_is_refused(copy_build, tmp_path):
    build = copy_build()
    outside = tmp_path / "elsewhere.py"
    module = build / "graph_module" / "module.py"
    outside.write_bytes(module.read_bytes())
    module.unlink()
    os.symlink(outside, module)
    _assert_integrity_failure(run_aot_here("validate", build), "module.py", "link")


@pytest.mark.artifact
def test_unlisted_files_are_reported(copy_build):
    build = copy_build()
    (build / "graph_module" / "sitecustomize.py").write_text("print('hi')\n")
    _assert_integrity_failure(run_aot_here("validate", build), "sitecustomize.py", "not listed")


@pytest.mark.artifact
@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{not json", "not valid JSON"), (b"\xff\xfe\x00", "not valid JSON"), ('{"artifacts": []}', "not an aot manifest")],
    ids=["truncated", "binary", "wrong-shape"],
)
def test_a_broken_manifest_is_an_integrity_failure(copy_build, content, fragment):
    build = copy_build()
    path = build / "manifest.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    _assert_integrity_failure(run_aot_here("validate", build), "manifest.json", fragment)


@pytest.mark.artifact
def test_a_missing_artifact_is_named(copy_build):
    build = copy_build()
    (build / "model.onnx.data").unlink()
    _assert_integrity_failure(run_aot_here("validate", build), "model.onnx.data", "missing")


@pytest.mark.artifact
def test_not_a_build_directory_is_a_usage_error(tmp_path):
    result = run_aot("validate", tmp_path)
    assert result.returncode == 2 and "not an aot build directory" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.artifact
@pytest.mark.parametrize("command", ["validate", "bench"])
def test_a_rehashed_module_py_runs_under_no_command_without_consent(copy_build, tmp_path, command):
    build, marker = copy_build(), tmp_path / "payload-ran"
    _plant_payload(build, marker)
    _rehash(build, "graph_module/module.py")  # the files and the manifest agree: only consent stands in the way
    extra = ["--runs", "1", "--no-memory"] if command == "bench" else []
    _assert_integrity_failure(run_aot(command, build, *extra), "did not build", "--expect-sha256", "--trust-code")
    assert not marker.exists()
    if command == "validate":  # consent given, the payload runs: the refusal above was the only guard
        run_aot(command, build, "--trust-code", *extra)
        assert marker.read_text() == PAYLOAD_MARK


@pytest.mark.artifact
def test_a_rehashed_recipe_factory_runs_without_consent_under_no_command(copy_build, tmp_path):
    build, marker = copy_build(), tmp_path / "factory-ran"
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["recipe"]["path"] = str(tmp_path / "gone.yaml")  # so the directory's own copy is the one used
    recipe = build / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(
        "  config:", f"  factory: subprocess:call\n  factory_kwargs: {{args: [touch, {marker}]}}\n  cfg:", 1))
    manifest["recipe"]["sha256"] = hashlib.sha256(recipe.read_bytes()).hexdigest()
    (build / "manifest.json").write_text(json.dumps(manifest))
    _rehash(build, "recipe.yaml")
    for command, extra in (("validate", []), ("bench", ["--runs", "1", "--no-memory"])):
        _assert_integrity_failure(run_aot(command, build, *extra), "did not build")
    assert not marker.exists()


@pytest.mark.artifact
def test_a_build_of_this_machine_and_a_published_digest_are_consent(copy_build, tmp_path):
    from aot.directory.consent import built_here

    build = copy_build()
    digest = _manifest_sha256(build)
    assert built_here(digest), "the precondition: aot build recorded it"
    assert run_aot("validate", build).returncode == 0
    env_without_record = {"AOT_CACHE_DIR": str(tmp_path / "another-machine")}
    refused = run_aot("validate", build, env=env_without_record)
    _assert_integrity_failure(refused, "did not build")
    assert run_aot("validate", build, "--expect-sha256", digest, env=env_without_record).returncode == 0


def test_a_digest_the_caller_just_made_stands_for_a_read_and_is_held_to_the_manifest(tmp_path, monkeypatch):
    import aot.directory.integrity as integrity
    from aot.errors import IntegrityError
    from tests.cache.conftest import fake_build

    build = fake_build(tmp_path / "build")
    recorded = json.loads((build / "manifest.json").read_text())["artifacts"]["model.onnx"]["sha256"]
    read = []
    sha256_file = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: (read.append(path.name), sha256_file(path))[1])
    assert integrity.verify_directory(build).files_checked == 3 and "model.onnx" in read, "precondition: each file is read"

    read.clear()
    integrity.verify_directory(build, digest=lambda relative, path: recorded if relative == "model.onnx" else None)
    assert "model.onnx" not in read and read, "the digest given stands for the read; the other files are read"
    with pytest.raises(IntegrityError, match=r"model\.onnx: sha256 differs"):
        integrity.verify_directory(build, digest=lambda relative, path: "0" * 64 if relative == "model.onnx" else None)
