"""Bad input to `aot sign` and `aot verify`: one line, exit 2, and no file it did not create touched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import run_aot
from tests.release.conftest import PASSWORD


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every file under ``roots`` with its sha256: what a failed command must leave as it was."""
    files = [path for root in roots for path in ([root] if root.is_file() else sorted(root.rglob("*"))) if path.is_file()]
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aot: error: "), result.described
    return lines[0]


@pytest.mark.parametrize("key_name, fragment", [
    ("missing", "not found"),
    ("rsa_private", "RSA, not elliptic-curve"),
    ("encrypted_private", "encrypted: give its password"),
    ("public", "not a PEM private key"),
])
def test_a_bad_key_is_exit_2_and_writes_nothing(copy_build, release_keys, cli, tmp_path, key_name, fragment):
    build = copy_build()
    key = tmp_path / "no-such-key.pem" if key_name == "missing" else getattr(release_keys, key_name)
    before = _snapshot(tmp_path)
    assert any(name.endswith("manifest.json") for name in before), "precondition: the build is in the snapshot"
    result = cli("sign", build, "--key", key, "--provenance", tmp_path / "prov.intoto.jsonl")
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert str(key) in line and fragment in line
    assert _snapshot(tmp_path) == before  # no signature, no provenance, no temporary file, the build untouched


def test_an_encrypted_key_signs_with_its_password_and_not_with_another(copy_build, release_keys, cli, tmp_path, monkeypatch):
    build = copy_build()
    wrong = cli("sign", build, "--key", release_keys.encrypted_private, "--password", "not it")
    assert wrong.exit_code == 2 and "wrong password" in _one_error_line(wrong)
    assert not (tmp_path / "build.sig").exists()
    monkeypatch.setenv("AOT_SIGNING_KEY_PASSWORD", PASSWORD)  # as a CI job passes it, out of the process listing
    right = cli("sign", build, "--key", release_keys.encrypted_private)
    assert right.exit_code == 0, right.described
    assert (tmp_path / "build.sig").is_file()


def test_a_failed_sign_leaves_the_earlier_signature_as_it_was(signed_build, release_keys, cli):
    build, signature, provenance = signed_build()
    before = _snapshot(signature, provenance)
    assert len(before) == 2, "precondition: a signature and a provenance"
    result = cli("sign", build, "--key", release_keys.rsa_private, "--provenance", provenance)
    assert result.exit_code == 2
    assert _snapshot(signature, provenance) == before


def test_a_file_that_is_not_a_signature_is_never_replaced(copy_build, release_keys, cli, tmp_path):
    build = copy_build()
    notes = tmp_path / "notes.txt"
    notes.write_text("my own file\n")
    result = cli("sign", build, "--key", release_keys.private, "--signature", notes)
    assert result.exit_code == 2 and "refusing to replace it" in _one_error_line(result)
    assert notes.read_text() == "my own file\n"


def test_a_build_that_no_longer_matches_its_manifest_is_not_signed(copy_build, release_keys, cli, tmp_path):
    build = copy_build()
    (build / "config.json").write_text("{}")
    result = cli("sign", build, "--key", release_keys.private)
    assert result.exit_code == 7 and "config.json" in _one_error_line(result)
    assert not (tmp_path / "build.sig").exists()


def test_verify_bad_usage_is_exit_2(signed_build, release_keys, cli, tmp_path):
    build, signature, _ = signed_build()
    cases = [
        (["--public-key", release_keys.private], "not a PEM public key"),  # the private half given by mistake
        (["--public-key", tmp_path / "absent.pub"], "public key not found"),
        (["--public-key", release_keys.public, "--signature", tmp_path / "absent.sig"], "signature not found"),
        ([], "--public-key or --certificate-chain"),
    ]
    for arguments, fragment in cases:
        result = cli("verify", build, *arguments)
        assert result.exit_code == 2, result.described
        assert fragment in _one_error_line(result)
    assert cli("verify", build, "--public-key", release_keys.public).exit_code == 0, "the signature itself was fine"


def test_without_the_sign_extra_aot_sign_says_how_to_install_it(copy_build, release_keys, tmp_path):
    build = copy_build()
    # model-signing's undeclared pyOpenSSL import, as a machine without the extra meets it: OpenSSL cannot be imported.
    blocker = tmp_path / "no_openssl"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['OpenSSL'] = None\n")
    result = run_aot("sign", build, "--key", release_keys.private, env={"PYTHONPATH": str(blocker)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'aot[sign]'" in lines[0] and "OpenSSL" in lines[0], result.stderr
    assert not (tmp_path / "build.sig").exists()
