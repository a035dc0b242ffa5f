"""The certificate form: `aot sign --certificate LEAF --chain ...`, verified against the root, by aot and model-signing."""

from __future__ import annotations

import model_signing
import pytest


def test_a_certificate_signature_verifies_against_its_root_only(copy_build, release_keys, cli, tmp_path):
    build = copy_build()
    signature = tmp_path / "build.sig"
    result = cli("sign", build, "--key", release_keys.private, "--certificate", release_keys.leaf_certificate,
                 "--chain", release_keys.root_certificate, "--provenance", tmp_path / "prov.intoto.jsonl")
    assert result.exit_code == 0, result.described
    assert signature.is_file()

    verified = cli("verify", build, "--certificate-chain", release_keys.root_certificate,
                   "--provenance", tmp_path / "prov.intoto.jsonl")  # the provenance checked with the leaf's key
    assert verified.exit_code == 0, verified.described
    assert "aot release job" in verified.stdout
    model_signing.verifying.Config().use_certificate_verifier(
        certificate_chain=[release_keys.root_certificate]).verify(build, signature)

    by_key = cli("verify", build, "--public-key", release_keys.public)
    assert by_key.exit_code == 7 and "verify it with --certificate-chain" in by_key.stderr, by_key.described

    stranger = cli("verify", build, "--certificate-chain", release_keys.other_root_certificate)
    assert stranger.exit_code == 7, stranger.described
    assert str(signature) in stranger.stderr and "certificate" in stranger.stderr
    with pytest.raises(Exception):  # precondition of the above: model-signing itself refuses the other root
        model_signing.verifying.Config().use_certificate_verifier(
            certificate_chain=[release_keys.other_root_certificate]).verify(build, signature)


def test_a_certificate_of_another_key_is_refused_before_signing(copy_build, release_keys, cli, tmp_path):
    build = copy_build()
    result = cli("sign", build, "--key", release_keys.other_private, "--certificate", release_keys.leaf_certificate,
                 "--chain", release_keys.root_certificate)
    assert result.exit_code == 2, result.described
    assert "certifies another key" in result.stderr and str(release_keys.leaf_certificate) in result.stderr
    assert not (tmp_path / "build.sig").exists()


def test_a_chain_needs_a_certificate_and_a_certificate_a_chain(copy_build, release_keys, cli, tmp_path):
    build = copy_build()
    result = cli("sign", build, "--key", release_keys.private, "--chain", release_keys.root_certificate)
    assert result.exit_code == 2 and "--chain needs --certificate" in result.stderr, result.described
    result = cli("sign", build, "--key", release_keys.private, "--certificate", release_keys.leaf_certificate)
    assert result.exit_code == 2 and "--certificate needs --chain" in result.stderr, result.described
    assert not (tmp_path / "build.sig").exists()


def test_an_encrypted_key_cannot_sign_with_a_certificate(copy_build, release_keys, cli, tmp_path):
    from tests.release.conftest import PASSWORD

    result = cli("sign", copy_build(), "--key", release_keys.encrypted_private, "--password", PASSWORD,
                 "--certificate", release_keys.leaf_certificate, "--chain", release_keys.root_certificate)
    assert result.exit_code == 2 and "encrypted key cannot sign with --certificate" in result.stderr, result.described
    assert not (tmp_path / "build.sig").exists()


def test_a_signature_checked_by_the_wrong_means_says_which_to_use(signed_build, release_keys, cli):
    build, _, _ = signed_build()
    assert cli("verify", build, "--public-key", release_keys.public).exit_code == 0, "precondition: a key signature"
    result = cli("verify", build, "--certificate-chain", release_keys.root_certificate)
    assert result.exit_code == 7 and "verify it with --public-key" in result.stderr, result.described
