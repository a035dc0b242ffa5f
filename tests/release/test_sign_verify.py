"""`aot sign` then `aot verify` on a real tiny build; model-signing's own verifier accepts what aot sign wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import model_signing
import pytest

from aot.directory.integrity import verify_directory
from aot.errors import IntegrityError
from tests.conftest import rehash_manifest


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aot: error: "), result.described
    return lines[0]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_signed_build_verifies_by_aot_and_by_model_signing(signed_build, release_keys, cli):
    build, signature, _ = signed_build()
    manifest_sha256 = hashlib.sha256((build / "manifest.json").read_bytes()).hexdigest()
    assert signature.is_file() and not (build / "model.sig").exists(), "precondition: the signature lies beside the build"

    result = cli("verify", build, "--public-key", release_keys.public)
    assert result.exit_code == 0, result.described
    assert manifest_sha256 in result.stdout and str(signature) in result.stdout

    # model-signing's Python API, configured from scratch (its hashing guessed from the signature) ...
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=release_keys.public).verify(build, signature)
    # ... and its command line, as a deploy job without aot would run it.
    command = [str(Path(sys.executable).with_name("model_signing")), "verify", "key", str(build),
               "--signature", str(signature), "--public_key", str(release_keys.public)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "Verification succeeded" in completed.stdout, completed.stderr


def test_the_signature_covers_every_file_and_names_the_manifest(signed_build):
    build, signature, _ = signed_build()
    from aot.release.verification import signed_files_of

    signed = signed_files_of(signature).files
    manifest = json.loads((build / "manifest.json").read_text())
    assert len(manifest["artifacts"]) >= 5, "precondition: a build of several files"
    assert set(signed) == set(manifest["artifacts"]) | {"manifest.json"}
    assert signed["manifest.json"] == hashlib.sha256((build / "manifest.json").read_bytes()).hexdigest()
    assert all(signed[name] == recorded["sha256"] for name, recorded in manifest["artifacts"].items())


def test_one_flipped_weight_byte_is_exit_7_naming_the_file(signed_build, release_keys, cli):
    build, _, _ = signed_build()
    weights = build / "graph_module" / "weights.safetensors"
    assert weights.is_file(), "precondition: the build ships its weights there"
    _flip_last_byte(weights)
    result = cli("verify", build, "--public-key", release_keys.public)
    assert result.exit_code == 7
    assert "graph_module/weights.safetensors" in _one_error_line(result)


def test_a_rehashed_manifest_does_not_fool_the_signature(signed_build, release_keys, cli):
    build, _, _ = signed_build()
    weights = build / "graph_module" / "weights.safetensors"
    _flip_last_byte(weights)
    rehash_manifest(build, "graph_module/weights.safetensors")
    verify_directory(build)  # precondition: the manifest alone now agrees with the changed file
    result = cli("verify", build, "--public-key", release_keys.public)
    assert result.exit_code == 7
    line = _one_error_line(result)
    assert "graph_module/weights.safetensors" in line and "manifest.json" in line


def test_another_key_is_exit_7_naming_the_signature(signed_build, release_keys, cli):
    build, signature, _ = signed_build()
    assert cli("verify", build, "--public-key", release_keys.public).exit_code == 0, "precondition: it verifies"
    result = cli("verify", build, "--public-key", release_keys.other_public)
    assert result.exit_code == 7
    line = _one_error_line(result)
    assert str(signature) in line and str(release_keys.other_public) in line


def test_a_file_added_after_signing_is_named(signed_build, release_keys, cli):
    build, _, _ = signed_build()
    (build / "notes.txt").write_text("added later")
    result = cli("verify", build, "--public-key", release_keys.public)
    assert result.exit_code == 7 and "notes.txt" in _one_error_line(result)


def test_a_signature_inside_the_directory_is_tolerated_and_left_out_of_what_it_signs(copy_build, release_keys, cli):
    build = copy_build()
    inside = build / "model.sig"
    result = cli("sign", build, "--key", release_keys.private, "--signature", inside)
    assert result.exit_code == 0, result.described
    assert inside.is_file() and not build.with_name("build.sig").exists()

    from aot.release.verification import signed_files_of

    assert "model.sig" not in signed_files_of(inside).files
    assert verify_directory(build).files_checked == len(json.loads((build / "manifest.json").read_text())["artifacts"])
    verified = cli("verify", build, "--public-key", release_keys.public)  # the default finds DIR/model.sig
    assert verified.exit_code == 0, verified.described
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=release_keys.public).verify(build, inside)

    from aot.directory.outdir import check_replaceable

    check_replaceable(build)  # a later aot build -o may replace a build that carries its signature inside


def test_inside_the_directory_only_the_release_names_are_tolerated(copy_build, release_keys, cli):
    build = copy_build()
    stray = build / "other.sig"
    result = cli("sign", build, "--key", release_keys.private, "--signature", stray)
    assert result.exit_code == 2 and "model.sig" in _one_error_line(result)
    assert not stray.exists()

    shutil.copy(build / "config.json", stray)
    with pytest.raises(IntegrityError, match="other.sig"):
        verify_directory(build)


def test_sign_and_verify_hold_the_files_to_the_manifest_by_model_signings_own_digests(tmp_path, release_keys, monkeypatch):
    import aot.directory.integrity as integrity
    from aot.directory.signed import sign_build, verify_build
    from tests.cache.conftest import fake_build

    build = fake_build(tmp_path / "build")
    read = []
    sha256_file = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: (read.append(path.name), sha256_file(path))[1])
    verify_directory(build)
    assert read, "precondition: the manifest check reads files when no digests are given"

    read.clear()
    signed = sign_build(build, release_keys.private, provenance=tmp_path / "build.provenance")
    verified = verify_build(build, public_key=release_keys.public, provenance=tmp_path / "build.provenance")
    assert read == [], "each file is hashed once, by model-signing"
    assert signed.files_signed == verified.files_signed == 4 and verified.files_checked == 3

    _flip_last_byte(build / "model.onnx")
    with pytest.raises(IntegrityError, match="model.onnx"):
        verify_build(build, public_key=release_keys.public)
    signature = Path(f"{build}.sig")
    before = signature.read_bytes()
    with pytest.raises(IntegrityError, match=r"model\.onnx: sha256 differs"):
        sign_build(build, release_keys.private)
    assert signature.read_bytes() == before, "a refused sign writes nothing"
