"""aot never deletes what it did not write: `-o` and `output:` replace only an empty directory or an aot build."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_BERT, run_aot


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_refused(result, directory: Path, before: dict[str, bytes], parent: Path) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aot: error: ") and str(directory.absolute()) in lines[0], result.stderr
    assert _tree_bytes(directory) == before, "the user's files must be byte-identical"
    assert not [p for p in parent.iterdir() if ".aot-tmp-" in p.name], "no staging directory left behind"


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("print('training')\n")
    (project / "data" / "weights.bin").write_bytes(bytes(range(256)))
    (project / "tiny.yaml").write_text(TINY_BERT)
    return project


@pytest.mark.artifact
def test_output_dot_in_a_project_is_refused_and_untouched(tmp_path):
    project = _project(tmp_path)
    before = _tree_bytes(project)
    assert "train.py" in before
    result = run_aot("build", "tiny.yaml", "-o", ".", cwd=project)
    _assert_refused(result, project, before, tmp_path)
    assert "not an aot build directory" in result.stderr


@pytest.mark.artifact
def test_recipe_output_key_onto_a_project_is_refused(tmp_path):
    project = _project(tmp_path)
    (project / "tiny.yaml").write_text(TINY_BERT + f"output: {project}\n")
    before = _tree_bytes(project)
    result = run_aot("build", project / "tiny.yaml", cwd=tmp_path)
    _assert_refused(result, project, before, tmp_path)


@pytest.mark.artifact
def test_a_file_of_the_users_inside_an_earlier_build_is_not_deleted(copy_build, tmp_path):
    build = copy_build()
    assert (build / "manifest.json").is_file()
    (build / "notes.txt").write_text("mine\n")
    before = _tree_bytes(build)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    result = run_aot("build", recipe, "-o", build, cwd=tmp_path)
    _assert_refused(result, build, before, tmp_path)
    assert "notes.txt" in result.stderr


@pytest.mark.artifact
def test_a_directory_with_a_foreign_manifest_is_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "manifest.json").write_text(json.dumps({"name": "someone else's"}))
    (target / "file.txt").write_text("keep\n")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    before = _tree_bytes(target)
    _assert_refused(run_aot("build", recipe, "-o", target, cwd=tmp_path), target, before, tmp_path)


def test_output_that_is_a_file_is_a_one_line_usage_error(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"\x00\x01")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    result = run_aot("build", recipe, "-o", target, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "is a file" in result.stderr, result.stderr
    assert target.read_bytes() == b"\x00\x01"


@pytest.mark.artifact
def test_an_empty_directory_and_an_earlier_build_are_replaced(cli, tmp_path, write_recipe):
    target = tmp_path / "empty"
    target.mkdir()
    recipe = write_recipe()
    result = cli("build", recipe, "-o", target)
    assert result.exit_code == 0, result.described
    assert (target / "manifest.json").is_file()
    result = cli("build", recipe, "-o", target)
    assert result.exit_code == 0, result.described


@contextlib.contextmanager
def _tmpfs(mountpoint: Path, options: str):
    """A small filesystem of our own (read-only, or full): skipped where this process may not mount one."""
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


def _build_into(directory: Path, tmp_path: Path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    return run_aot("build", recipe, "-o", directory / "out", cwd=tmp_path)


@pytest.mark.artifact
def test_read_only_output_is_refused_before_any_work(tmp_path):
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as mountpoint:
        result = _build_into(mountpoint, tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "not writable" in result.stderr, result.stderr


@pytest.mark.artifact
def test_a_full_disk_is_an_export_failure_and_leaves_nothing(tmp_path):
    with _tmpfs(tmp_path / "full", "size=200k") as mountpoint:
        result = _build_into(mountpoint, tmp_path)
        left = list(mountpoint.iterdir())
    assert result.returncode == 6, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], result.stderr
    assert left == [], "the staging directory is removed"


@contextlib.contextmanager
def _immutable(directory: Path):
    """``directory`` made immutable (chattr +i): skipped where this process may not set the flag."""
    directory.mkdir()
    flagged = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
    if flagged.returncode != 0:
        pytest.skip(f"cannot make a directory immutable here: {flagged.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=False)


@pytest.mark.parametrize("kind", ["mount point", "immutable"])
def test_a_directory_the_final_rename_cannot_replace_is_refused_before_any_work(cli, write_recipe, tmp_path, kind):
    place = _tmpfs(tmp_path / "mounted", "size=1m") if kind == "mount point" else _immutable(tmp_path / "frozen")
    with place as target:
        assert target.is_dir() and not list(target.iterdir())  # precondition: empty, which aot may otherwise replace
        result = cli("build", write_recipe(), "-o", target)
        assert result.exit_code == 2, result.described
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and (kind in lines[0]), result.described
        assert not list(target.iterdir()) and not [p for p in tmp_path.iterdir() if ".aot-tmp-" in p.name]
