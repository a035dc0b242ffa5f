"""aot never deletes what it did not write: `-o` and `output:` replace only an empty directory or an aot build."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from aot.errors import RecipeError
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
@pytest.mark.parametrize("folder", ["extra_dir", "graph_module/sub"])
def test_an_empty_folder_of_the_users_inside_an_earlier_build_is_not_deleted(copy_build, folder):
    from aot.directory.outdir import check_replaceable

    build = copy_build()
    check_replaceable(build)  # precondition: the build as written may be replaced, its own folders and all
    (build / folder).mkdir()
    with pytest.raises(RecipeError, match=f"holds '{folder}', which its manifest.json does not list"):
        check_replaceable(build)


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
def _mount(mountpoint: Path, *arguments: str):
    """``mount ARGUMENTS MOUNTPOINT`` while the test runs: skipped where this process may not mount."""
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", *arguments, str(mountpoint)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


def _tmpfs(mountpoint: Path, options: str):
    """A small filesystem of our own (read-only, or full)."""
    return _mount(mountpoint, "-t", "tmpfs", "-o", options, "tmpfs")


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
def _flagged(directory: Path, flag: str):
    """``directory`` made immutable (``+i``) or append-only (``+a``) by chattr: skipped where this process may not."""
    directory.mkdir(exist_ok=True)
    flagged = subprocess.run(["chattr", flag, str(directory)], capture_output=True)
    if flagged.returncode != 0:
        pytest.skip(f"cannot chattr {flag} here: {flagged.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", flag.replace("+", "-"), str(directory)], check=False)


def _unmovable(kind: str, tmp_path: Path):
    """An empty output directory that a build may replace by the rules, but a rename cannot: (context, target)."""
    if kind == "mount point":
        return _tmpfs(tmp_path / "mounted", "size=1m"), None
    if kind == "bind mount":
        (tmp_path / "source").mkdir()  # the same filesystem: os.path.ismount cannot tell
        return _mount(tmp_path / "bound", "--bind", str(tmp_path / "source")), None
    if kind == "immutable":
        return _flagged(tmp_path / "frozen", "+i"), None
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "out").mkdir()
    return _flagged(tmp_path / "log", "+a"), "out"  # append-only parent: entries made, none renamed or removed


@pytest.mark.parametrize("kind, expected", [("mount point", "mount point"), ("bind mount", "mount point"),
                                            ("immutable", "immutable"), ("append-only parent", "append-only")])
def test_a_directory_the_final_rename_cannot_replace_is_refused_before_any_work(cli, write_recipe, tmp_path, kind, expected):
    place, inside = _unmovable(kind, tmp_path)
    with place as directory:
        target = directory / inside if inside else directory
        assert target.is_dir() and not list(target.iterdir())  # precondition: empty, which aot may otherwise replace
        result = cli("build", write_recipe(), "-o", target)
        assert result.exit_code == 2, result.described
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and expected in lines[0], result.described
        assert not list(target.iterdir()) and not [p for p in target.parent.iterdir() if ".aot-tmp-" in p.name]
