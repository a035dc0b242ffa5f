"""File digests in the manifest, and the reuse of digests taken earlier in the build."""

from __future__ import annotations

import hashlib
import os

from aot.directory import manifest
from aot.directory.manifest import describe_files, hash_files


def _tree(root):
    (root / "graph_module").mkdir()
    (root / "graph_module" / "weights.bin").write_bytes(b"w" * 1000)
    (root / "recipe.yaml").write_text("name: x\n")
    (root / manifest.MANIFEST_NAME).write_text("{}")


def test_digests_are_sha256_of_every_file_but_the_manifest(tmp_path):
    _tree(tmp_path)
    files = describe_files(tmp_path)
    assert sorted(files) == ["graph_module/weights.bin", "recipe.yaml"]
    assert files["graph_module/weights.bin"] == {"sha256": hashlib.sha256(b"w" * 1000).hexdigest(), "bytes": 1000}


def test_earlier_digests_are_reused_only_for_unchanged_files(tmp_path, monkeypatch):
    _tree(tmp_path)
    earlier = hash_files(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    changed = tmp_path / "recipe.yaml"
    changed.write_text("name: changed\n")
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    read = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda path: read.append(path.name) or real(path))
    files = describe_files(tmp_path, earlier=earlier)
    assert sorted(read) == ["model.onnx", "recipe.yaml"]
    assert files["recipe.yaml"]["sha256"] == hashlib.sha256(b"name: changed\n").hexdigest()
    assert files == describe_files(tmp_path)
