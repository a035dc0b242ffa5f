"""``aot build --cache URL`` end to end on real tiny builds: a miss stores, a hit restores the same bytes (and is no
consent to run them), a corrupt or incomplete entry is refused and rebuilt, an unreachable store is built without."""

from __future__ import annotations

import json
import logging
import re

import pytest

from aot.cache.save import save_build
from aot.cache.store import CacheStore
from aot.directory.consent import built_here
from aot.directory.integrity import verify_directory
from tests.cache.conftest import BUCKET, closed_port, fake_build, fake_key, tree_bytes
from tests.conftest import run_aot
from tests.log_messages import messages_of


@pytest.mark.artifact  # a real build, then its restore: tens of seconds
def test_a_miss_stores_and_a_hit_restores_the_same_files_without_consent(cli, write_recipe, tmp_path, monkeypatch):
    from aot.builder import build_with_cache

    recipe, cache, built = write_recipe(), tmp_path / "cache", tmp_path / "built"
    miss = build_with_cache(recipe, built, cache=cache)
    assert miss.report is not None and miss.cache.stored and not miss.cache.hit  # precondition: it was built, then stored
    key, sha256 = miss.cache.key, miss.manifest_sha256
    assert len(key) == 64 and (cache / "entries" / f"{key}.json").is_file()
    assert built_here(sha256), "precondition: a build records itself as built here"
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "consent-of-another-machine"))
    assert not built_here(sha256)

    restored = tmp_path / "restored"
    hit = cli("build", recipe, "-o", restored, "--cache", cache)
    assert hit.exit_code == 0, hit.described
    files = len(verify_directory(built).manifest["artifacts"]) + 1
    assert hit.stdout.splitlines() == [f"cache hit {key[:12]}…: restored {files} files to {restored}; manifest sha256 {sha256}"]
    assert tree_bytes(restored) == tree_bytes(built)
    assert not built_here(sha256), "a hit is no consent to run the directory's code"

    again = cli("build", recipe, "-o", restored, "--cache", cache, "--json")  # over an earlier build: allowed
    assert again.exit_code == 0, again.described
    report = json.loads(again.stdout)
    assert report["cache"]["hit"] is True and report["cache"]["key"] == key and report["cache"]["url"] == str(cache)
    assert report["output"] == str(restored) and report["manifest_sha256"] == sha256 and report["ok"] is True

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('mine')\n")
    refused = cli("build", recipe, "-o", project, "--cache", cache)
    assert refused.exit_code == 2, refused.described
    assert "not an aot build directory" in refused.stderr and tree_bytes(project) == {"train.py": b"print('mine')\n"}


@pytest.mark.artifact
def test_a_corrupt_or_incomplete_entry_on_s3_is_refused_and_rebuilt(cli, write_recipe, tmp_path, s3_endpoint):
    recipe, url = write_recipe(), f"s3://{BUCKET}/{tmp_path.name}"
    cache_args = ("--cache", url, "--cache-option", f"endpoint_url={s3_endpoint}")
    first = cli("build", recipe, "-o", tmp_path / "first", *cache_args)
    assert first.exit_code == 0 and re.search(r"^cache miss [0-9a-f]{12}…; stored \d+ files in s3://", first.stdout, re.M), first.described
    store = CacheStore.open(url, {"endpoint_url": s3_endpoint})
    (key,) = store.entry_keys()
    weights = store.read_entry(key).files["graph_module/weights.safetensors"]
    store.fs.pipe_file(store.blob_path(weights.sha256), b"\0" * weights.bytes)  # the bytes rot; the size stays

    with messages_of("aot.builder.cached", logging.WARNING) as warnings:
        rebuilt = cli("build", recipe, "-o", tmp_path / "rebuilt", *cache_args)
    assert rebuilt.exit_code == 0 and "cache miss" in rebuilt.stdout, rebuilt.described
    assert len(warnings) == 1 and f"entries/{key}.json: blob {weights.sha256} (graph_module/weights.safetensors)" in warnings[0]
    verify_directory(tmp_path / "rebuilt")
    artifacts = {name: data for name, data in tree_bytes(tmp_path / "rebuilt").items() if name != "manifest.json"}
    assert artifacts == {name: data for name, data in tree_bytes(tmp_path / "first").items() if name != "manifest.json"}

    hit = cli("build", recipe, "-o", tmp_path / "hit", *cache_args)  # the entry was overwritten, the blob sent again
    assert hit.stdout.startswith(f"cache hit {key[:12]}…"), hit.described
    assert tree_bytes(tmp_path / "hit") == tree_bytes(tmp_path / "rebuilt")

    store.remove_blob(store.read_entry(key).files["model.onnx"].sha256)
    with messages_of("aot.builder.cached", logging.WARNING) as warnings:
        incomplete = cli("build", recipe, "-o", tmp_path / "hit", *cache_args)
    assert incomplete.exit_code == 0 and "cache miss" in incomplete.stdout, incomplete.described
    assert len(warnings) == 1 and "(model.onnx) missing from the store" in warnings[0], warnings
    verify_directory(tmp_path / "hit")


@pytest.mark.artifact
def test_an_unreachable_cache_builds_without_it_in_one_warning_line(write_recipe, tmp_path, s3_endpoint):
    output = tmp_path / "out"
    result = run_aot("build", write_recipe(), "-o", output, "--cache", f"s3://{BUCKET}/x",
                     "--cache-option", f"endpoint_url=http://127.0.0.1:{closed_port()}",
                     "--cache-option", "config_kwargs={retries: {max_attempts: 1}}")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING aot.builder.cached: build cache not used (s3://"), result.stderr
    assert "EndpointConnectionError" in lines[0] and "building without it" in lines[0]
    assert result.stdout.startswith("built ") and len(result.stdout.splitlines()) == 1, result.stdout  # no cache line
    verify_directory(output)


def test_cache_ls_lists_entries_and_an_unreachable_url_is_exit_2(cli, tmp_path):
    url = str(tmp_path / "cache")
    entry = save_build(CacheStore.open(url), fake_key(), fake_build(tmp_path / "built"), "fake-a", {})
    listed = cli("cache", "ls", url)
    assert listed.exit_code == 0, listed.described
    assert re.fullmatch(rf"{entry.key[:16]}  \d{{4}}-\d\d-\d\d \d\d:\d\d  +0\.0 MiB  4 files  fake-a\n", listed.stdout), listed.stdout
    as_json = json.loads(cli("cache", "ls", url, "--json").stdout)
    assert [(item["key"], item["name"], item["files"]) for item in as_json] == [(entry.key, "fake-a", 4)]

    pruned = cli("cache", "prune", url, "--keep", "0", "--blob-grace", "0")
    assert pruned.exit_code == 0 and pruned.stdout == f"removed 1 entry (0 kept) and 4 blobs (0 kept) from {url}\n", pruned.described

    a_file = tmp_path / "file"
    a_file.write_text("")
    unreachable = cli("cache", "ls", a_file / "cache")
    assert unreachable.exit_code == 2, unreachable.described
    assert unreachable.stderr == f"aot: error: {a_file}/cache: no build cache there (nothing at that path)\n"
    assert a_file.read_text() == ""


def test_cache_ls_and_prune_read_a_cache_and_make_none(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    assert cli("cache", "ls", tmp_path / "empty").stdout == f"no entries in {tmp_path / 'empty'}\n"  # precondition: a cache yet to fill
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_build").mkdir()
    (tmp_path / "a_build" / "manifest.json").write_text("{}")
    cases = {
        tmp_path / "typo" / "cache": "no build cache there (nothing at that path)",
        tmp_path / "a_file": "a file, not a build cache directory",
        tmp_path / "a_build": "holds no build cache (no entries/ or blobs/ in it)",
    }
    before = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    for url, message in cases.items():
        for command in (["ls"], ["prune", "--keep", "0"]):
            result = cli("cache", *command, url)
            assert result.exit_code == 2 and result.stderr == f"aot: error: {url}: {message}\n", result.described
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == before, "nothing made, nothing removed"


def test_an_object_stores_empty_prefix_is_an_empty_cache(cli, tmp_path, s3_endpoint):
    url, option = f"s3://{BUCKET}/{tmp_path.name}", ("--cache-option", f"endpoint_url={s3_endpoint}")
    entry = save_build(CacheStore.open(url, {"endpoint_url": s3_endpoint}), fake_key(), fake_build(tmp_path / "built"), "fake-a", {})
    assert cli("cache", "ls", url, *option).stdout.startswith(entry.key[:16])  # precondition: the store is reached
    pruned = cli("cache", "prune", url, "--keep", "0", "--blob-grace", "0", *option)
    assert pruned.exit_code == 0, pruned.described
    for command in (["ls"], ["prune"]):  # no object under the prefix now: a cache with nothing in it, as a directory's
        result = cli("cache", *command, url, *option)
        assert result.exit_code == 0 and result.stdout.startswith(("no entries in", "removed 0 entries")), result.described
