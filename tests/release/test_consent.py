"""A signature that verifies with a key the user names is consent to run the directory's code: `--public-key` on
`aot validate`, `aot bench`, `aot run`, and `public_key=` on `aot.load`."""

from __future__ import annotations

import pytest

import aot
from aot.errors import IntegrityError, RecipeError


@pytest.fixture
def elsewhere(monkeypatch, tmp_path):
    """This machine's record of its builds, emptied: every directory now comes from elsewhere."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "empty-cache"))


def _plant(build) -> None:
    module = build / "graph_module" / "module.py"
    module.write_text(module.read_text() + "\nraise SystemExit('planted code ran')\n")


def test_aot_load_runs_a_signed_directorys_code_with_its_public_key(signed_build, release_keys, elsewhere):
    build, signature, _ = signed_build()
    with pytest.raises(IntegrityError, match="--public-key"):
        aot.load(build, "torch")  # precondition: without a key, no consent
    model = aot.load(build, "torch", public_key=release_keys.public)
    assert model.runtime == "torch"
    assert aot.load(build, "torch", public_key=release_keys.public, signature=signature).runtime == "torch"


def test_a_re_signed_payload_does_not_run_with_the_genuine_key(signed_build, release_keys, cli, tmp_path, elsewhere):
    build, signature, _ = signed_build()
    _plant(build)
    from tests.conftest import rehash_manifest

    rehash_manifest(build, "graph_module/module.py")
    resigned = cli("sign", build, "--key", release_keys.other_private, "--signature", tmp_path / "attacker.sig")
    assert resigned.exit_code == 0, resigned.described  # precondition: the attacker's own signature is sound
    with pytest.raises(IntegrityError, match="not signed by"):
        aot.load(build, "torch", public_key=release_keys.public, signature=tmp_path / "attacker.sig")
    with pytest.raises(IntegrityError, match="module.py"):
        aot.load(build, "torch", public_key=release_keys.public, signature=signature)


def test_aot_run_with_the_public_key(signed_build, release_keys, cli, elsewhere):
    build, _, _ = signed_build()
    refused = cli("run", build, "--runtime", "torch", "--ids", "2 5 7 3")
    assert refused.exit_code == 7 and "--public-key" in refused.stderr, refused.described
    result = cli("run", build, "--runtime", "torch", "--ids", "2 5 7 3", "--public-key", release_keys.public, "--json")
    assert result.exit_code == 0, result.described
    assert '"embedding"' in result.stdout
    other = cli("run", build, "--runtime", "torch", "--ids", "2 5 7 3", "--public-key", release_keys.other_public)
    assert other.exit_code == 7 and "not signed by" in other.stderr, other.described


def test_bench_stops_at_a_signature_that_fails_before_running_anything(signed_build, release_keys, cli, elsewhere):
    build, _, _ = signed_build()
    result = cli("bench", build, "--runs", "1", "--no-memory", "--public-key", release_keys.other_public)
    assert result.exit_code == 7 and "not signed by" in result.stderr, result.described
    assert "median" not in result.stdout


def test_a_signature_without_a_public_key_is_a_usage_error(signed_build, cli):
    build, signature, _ = signed_build()
    result = cli("run", build, "--ids", "2 5", "--signature", signature)
    assert result.exit_code == 2 and "--signature needs --public-key" in result.stderr, result.described
    with pytest.raises(RecipeError, match="public_key"):
        aot.load(build, signature=signature)


@pytest.mark.artifact
def test_aot_validate_with_the_public_key(signed_build, release_keys, cli, elsewhere):
    build, _, _ = signed_build()
    refused = cli("validate", build)
    assert refused.exit_code == 7 and "--public-key" in refused.stderr, refused.described
    result = cli("validate", build, "--public-key", release_keys.public)
    assert result.exit_code == 0, result.described
    assert "files match the manifest" in result.stdout
