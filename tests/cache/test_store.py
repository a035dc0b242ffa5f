"""Blobs and entries on a directory, memory:// and S3 (moto's server, s3fs): stored, restored, refused, pruned.

The build directories here are made in milliseconds (files and a manifest aot's integrity check accepts);
tests/cache/test_build_cache.py builds real ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from aot.cache.entry import CacheEntry, StoredFile
from aot.cache.errors import CacheUnavailable, CorruptEntry
from aot.cache.prune import prune
from aot.cache.restore import restore_entry
from aot.cache.save import save_build
from aot.cache.store import CacheStore, check_cache_url, storage_options
from aot.errors import RecipeError
from tests.cache.conftest import closed_port, fake_build, fake_key, tree_bytes


# The fake builds' weights (16 KiB) are stored as chunks of this size, the last one shorter; the other files whole.
CHUNK_BYTES = 5000
WEIGHTS = "graph_module/weights.safetensors"


def _saved(store_location, tmp_path: Path, seed: str = "a") -> tuple[CacheStore, CacheEntry, Path]:
    url, options = store_location
    store = CacheStore.open(url, options, chunk_bytes=CHUNK_BYTES)
    built = fake_build(tmp_path / f"built-{seed}", seed)
    entry = save_build(store, fake_key(seed), built, f"fake-{seed}", {"name": f"fake-{seed}"})
    return store, entry, built


def test_a_stored_build_restores_byte_identical(store_location, tmp_path):
    store, entry, built = _saved(store_location, tmp_path)
    assert len(entry.key) == 64 and store.read_entry(entry.key) == entry  # the whole digest names it
    assert store.fs.exists(store.blob_path(entry.files["model.onnx"].sha256))
    weights = entry.files[WEIGHTS]
    assert len(weights.chunks) == 4 and weights.chunk_bytes == CHUNK_BYTES and not entry.files["model.onnx"].chunks
    assert [store.fs.size(store.blob_path(digest)) for digest in weights.chunks] == [5000, 5000, 5000, 1384]
    assert not store.fs.exists(store.blob_path(weights.sha256)), "a chunked file has no blob of its own"
    target = tmp_path / "restored"
    assert not target.exists()  # precondition
    assert restore_entry(store, entry, target) == 4
    assert tree_bytes(target) == tree_bytes(built)
    assert not [p for p in tmp_path.iterdir() if ".aot-tmp-" in p.name], "no staging directory left behind"


def test_a_chunked_file_is_read_once_and_held_to_its_manifest_by_those_reads(tmp_path, monkeypatch):
    import aot.directory.integrity as integrity

    store = CacheStore.open(str(tmp_path / "store"), {}, chunk_bytes=CHUNK_BYTES)
    built = fake_build(tmp_path / "built")
    assert (built / WEIGHTS).stat().st_size > CHUNK_BYTES, "precondition: the weights are chunked"
    read_whole = []
    sha256_file = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: (read_whole.append(path.name), sha256_file(path))[1])
    entry = save_build(store, fake_key(), built, "fake-a", {"name": "fake-a"})
    assert "weights.safetensors" not in read_whole and sorted(read_whole) == ["config.json", "model.onnx"]
    assert entry.files[WEIGHTS].sha256 == hashlib.sha256((built / WEIGHTS).read_bytes()).hexdigest()


def test_a_chunked_file_changed_after_the_build_is_refused_and_no_entry_is_written(tmp_path):
    from aot.errors import IntegrityError

    store = CacheStore.open(str(tmp_path / "store"), {}, chunk_bytes=CHUNK_BYTES)
    built = fake_build(tmp_path / "built")
    weights = bytearray((built / WEIGHTS).read_bytes())
    weights[-1] ^= 1  # same size: only the digest can tell
    (built / WEIGHTS).write_bytes(bytes(weights))
    with pytest.raises(IntegrityError, match="weights.safetensors: sha256 differs"):
        save_build(store, fake_key(), built, "fake-a", {"name": "fake-a"})
    assert store.read_entry(fake_key().digest) is None


def test_storing_again_sends_only_new_blobs(store_location, tmp_path):
    url, options = store_location
    store = CacheStore.open(url, options, chunk_bytes=CHUNK_BYTES)
    sent = []
    put_blob, put_blobs = store.put_blob, store.put_blobs  # spies: the uploads still run
    store.put_blob = lambda local, digest: (sent.append(local.name), put_blob(local, digest))
    store.put_blobs = lambda blobs: (sent.extend(f"chunk {len(data)}" for data in blobs.values()), put_blobs(blobs))
    first = save_build(store, fake_key("a"), fake_build(tmp_path / "a", "a"), "a", {})
    chunks = ["chunk 1384", "chunk 5000", "chunk 5000", "chunk 5000"]
    assert sorted(sent) == [*chunks, "config.json", "manifest.json", "model.onnx"]  # precondition
    sent.clear()
    again = save_build(store, fake_key("a2"), fake_build(tmp_path / "a2", "a"), "a2", {})
    assert again.files[WEIGHTS] == first.files[WEIGHTS], "precondition: the same weights"
    assert sent == [], "a build whose files and chunks are all stored sends nothing"
    sent.clear()
    second = save_build(store, fake_key("b"), fake_build(tmp_path / "b", "b"), "b", {})
    assert second.files["config.json"] == first.files["config.json"], "precondition: one file the same in both"
    assert sorted(sent) == [*chunks, "manifest.json", "model.onnx"]
    assert store.entry_keys() == sorted([first.key, again.key, second.key])


@pytest.mark.parametrize("relative", ["model.onnx", "manifest.json"])
def test_a_blob_that_is_not_its_digest_is_refused_and_removed(store_location, tmp_path, relative):
    store, entry, _ = _saved(store_location, tmp_path)
    digest = entry.files[relative].sha256
    blob = store.blob_path(digest)
    store.fs.pipe_file(blob, b"X" * entry.files[relative].bytes)  # same size, other bytes
    target = tmp_path / "restored"
    with pytest.raises(CorruptEntry, match=rf"entries/{entry.key}\.json: blob {digest} \({re.escape(relative)}\) does not hold"):
        restore_entry(store, entry, target)
    assert not target.exists(), "a refused entry leaves the target as it was"
    assert not store.fs.exists(blob), "a blob that is not its name can serve no one"
    assert not [p for p in tmp_path.iterdir() if ".aot-tmp-" in p.name]


@pytest.mark.parametrize("relative", ["model.onnx", WEIGHTS])
def test_an_entry_whose_blob_is_missing_is_refused(store_location, tmp_path, relative):
    store, entry, _ = _saved(store_location, tmp_path)
    stored = entry.files[relative]
    digest = stored.chunks[2] if stored.chunks else stored.sha256
    store.remove_blob(digest)
    target = tmp_path / "restored"
    named = "chunk 2 of " + relative if stored.chunks else relative
    with pytest.raises(CorruptEntry, match=rf"blob {digest} \({re.escape(named)}\) missing from the store"):
        restore_entry(store, entry, target)
    assert not target.exists()
    assert not [p for p in tmp_path.iterdir() if ".aot-tmp-" in p.name]


@pytest.mark.parametrize("size", ["same", "shorter"])
def test_a_chunk_that_is_not_its_digest_is_refused_and_removed(store_location, tmp_path, size):
    store, entry, _ = _saved(store_location, tmp_path)
    digest = entry.files[WEIGHTS].chunks[1]
    assert len(set(entry.files[WEIGHTS].chunks)) == 4  # precondition: this chunk is no other's
    store.fs.pipe_file(store.blob_path(digest), b"X" * (CHUNK_BYTES if size == "same" else 10))
    target = tmp_path / "restored"
    with pytest.raises(CorruptEntry, match=rf"blob {digest} \(chunk 1 of {WEIGHTS}\) does not hold the bytes its name says"):
        restore_entry(store, entry, target)
    assert not target.exists()
    assert not store.fs.exists(store.blob_path(digest))
    assert store.fs.exists(store.blob_path(entry.files[WEIGHTS].chunks[0])), "the good chunks stay"


def test_chunks_that_do_not_make_the_file_are_refused(tmp_path):
    store, entry, _ = _saved((str(tmp_path / "cache"), {}), tmp_path)
    weights = entry.files[WEIGHTS]
    swapped = (weights.chunks[1], weights.chunks[0], *weights.chunks[2:])  # each chunk its name, the file not its digest
    wrong = CacheEntry(entry.key, entry.name, entry.created, entry.manifest_sha256,
                       {**entry.files, WEIGHTS: StoredFile(weights.sha256, weights.bytes, swapped, weights.chunk_bytes)},
                       entry.report, entry.inputs)
    with pytest.raises(CorruptEntry, match=rf"its files disagree with its manifest.json: {WEIGHTS}: .*sha256"):
        restore_entry(store, wrong, tmp_path / "restored")
    assert all(store.fs.exists(store.blob_path(digest)) for digest in weights.chunks), "no chunk is blamed"


def test_an_entry_whose_chunks_do_not_cover_the_file_is_refused(tmp_path):
    store, entry, _ = _saved((str(tmp_path / "cache"), {}), tmp_path)
    document = entry.to_json()
    document["files"][WEIGHTS]["chunks"].pop()
    store.fs.pipe_file(store.entry_path(entry.key), json.dumps(document).encode())
    with pytest.raises(CorruptEntry, match=rf"files\['{WEIGHTS}'\]: its chunks do not cover its 16384 bytes"):
        store.read_entry(entry.key)


def test_an_unreadable_entry_is_refused_naming_it(store_location, tmp_path):
    store, entry, _ = _saved(store_location, tmp_path)
    store.fs.pipe_file(store.entry_path(entry.key), b'{"format": 1, "key": "trunc')
    with pytest.raises(CorruptEntry, match=rf"entries/{entry.key}\.json: not valid JSON"):
        store.read_entry(entry.key)


def test_files_that_disagree_with_their_manifest_are_refused(tmp_path):
    store, entry, built = _saved((str(tmp_path / "cache"), {}), tmp_path)
    extra = built / "notes.txt"
    extra.write_text("not in the manifest\n")
    digest = hashlib.sha256(extra.read_bytes()).hexdigest()
    store.put_blob(extra, digest)
    padded = CacheEntry(entry.key, entry.name, entry.created, entry.manifest_sha256,
                        {**entry.files, "notes.txt": StoredFile(digest, extra.stat().st_size)}, entry.report, entry.inputs)
    with pytest.raises(CorruptEntry, match=r"its files disagree with its manifest.json: notes.txt: not listed"):
        restore_entry(store, padded, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b", "a\\b", "./a"])
def test_an_entry_naming_a_path_outside_the_directory_is_refused(tmp_path, path):
    store, entry, _ = _saved((str(tmp_path / "cache"), {}), tmp_path)
    document = entry.to_json()
    document["files"][path] = document["files"]["model.onnx"]
    store.fs.pipe_file(store.entry_path(entry.key), json.dumps(document).encode())
    with pytest.raises(CorruptEntry, match="would leave the build directory"):
        store.read_entry(entry.key)


def test_a_store_that_cannot_be_reached_or_made_is_unavailable(tmp_path, s3_endpoint):
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(CacheUnavailable, match=rf"{a_file}/cache: cannot open the cache: NotADirectoryError"):
        CacheStore.open(a_file / "cache")
    with pytest.raises(CacheUnavailable, match="nope://x: ValueError: Protocol not known"):
        CacheStore.open("nope://x")
    options = {"endpoint_url": f"http://127.0.0.1:{closed_port()}", "config_kwargs": {"retries": {"max_attempts": 1}}}
    with pytest.raises(CacheUnavailable, match="s3://bucket/cache: cannot open the cache: EndpointConnectionError"):
        CacheStore.open("s3://bucket/cache", options)


def test_cache_options_are_yaml_values():
    assert storage_options(["endpoint_url=http://127.0.0.1:9000", "anon=true", "config_kwargs={retries: {max_attempts: 1}}"]) == {
        "endpoint_url": "http://127.0.0.1:9000", "anon": True, "config_kwargs": {"retries": {"max_attempts": 1}}}
    with pytest.raises(RecipeError, match="--cache-option anon: not KEY=VALUE"):
        storage_options(["anon"])


def test_prune_removes_old_entries_then_the_blobs_no_entry_names(store_location, tmp_path):
    url, options = store_location
    store = CacheStore.open(url, options, chunk_bytes=CHUNK_BYTES)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    entries = {}
    for age_days, seed in ((0, "new"), (3, "mid"), (10, "old")):
        built = fake_build(tmp_path / seed, seed)
        saved = save_build(store, fake_key(seed), built, seed, {})
        entries[seed] = CacheEntry(saved.key, seed, now - timedelta(days=age_days), saved.manifest_sha256, saved.files, {}, {})
        store.write_entry(entries[seed])
    broken = fake_key("broken").digest
    store.fs.pipe_file(store.entry_path(broken), b"not json")
    blobs_before = len(store.blob_files())
    assert len(store.entry_keys()) == 4 and blobs_before == 3 * 6 + 1  # precondition: per build a manifest, model.onnx and 4 chunks; config.json shared

    report = prune(store, older_than=timedelta(days=5), blob_grace=timedelta(0))
    assert sorted(report.entries_removed) == sorted([entries["old"].key, broken])
    assert store.entry_keys() == sorted([entries["new"].key, entries["mid"].key])
    assert report.blobs_removed == 6 and len(store.blob_files()) == blobs_before - 6  # old's own blobs only
    assert store.fs.exists(store.blob_path(entries["old"].files["config.json"].sha256)), "a blob others name stays"

    report = prune(store, keep=1, blob_grace=timedelta(hours=1))
    assert report.entries_removed == [entries["mid"].key]
    assert report.blobs_removed == 0, "blobs younger than the grace stay: a build may be storing them"
    report = prune(store, keep=1, blob_grace=timedelta(0))
    assert report.blobs_removed == 6 and report.entries_kept == 1
    new = tmp_path / "restored"
    restore_entry(store, entries["new"], new)  # what remains still restores
    assert tree_bytes(new) == tree_bytes(tmp_path / "new")


@pytest.mark.parametrize("url", ["foo://bucket/aot", "simplecache::foo://bucket/aot", "foo::memory://aot", "foo::/tmp/aot"])
def test_a_protocol_fsspec_does_not_know_is_a_usage_error_before_the_build(cli, write_recipe, tmp_path, url):
    for usable in (str(tmp_path / "cache"), "memory://aot", "file:///tmp/aot", "s3://bucket/aot", "simplecache::s3://bucket/aot",
                   "gs://bucket/aot"):  # gcsfs is not installed: a known protocol, so a warning at the build, not this
        check_cache_url(usable)  # precondition: what fsspec knows passes, installed or not (a backend missing is a warning)
    output = tmp_path / "out"
    result = cli("build", write_recipe(), "-o", output, "--cache", url)
    assert result.exit_code == 2, result.described
    assert result.stderr.strip().splitlines() == [f"aot: error: --cache {url}: unknown protocol 'foo', none that fsspec knows"]
    assert not output.exists()
