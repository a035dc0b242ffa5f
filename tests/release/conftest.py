"""Key material for the release tests, made with cryptography in a temporary directory: no key is checked in.

``release_keys``: an EC P-256 signing key and its public half, a second EC key (another signer), an RSA key, an
encrypted EC key (password ``PASSWORD``), and a tiny certificate chain (a root CA and a leaf that certifies the
signing key for digital signatures).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class ReleaseKeys:
    private: Path
    public: Path
    other_private: Path
    other_public: Path
    rsa_private: Path
    encrypted_private: Path
    root_certificate: Path
    other_root_certificate: Path
    leaf_certificate: Path


def _write_private(path: Path, key, password: str | None = None) -> Path:
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path


def _write_public(path: Path, key) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def _certificate(subject: str, public_key, issuer: str, issuer_key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False, data_encipherment=False,
                          key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .sign(issuer_key, hashes.SHA256()))


def _write_certificate(path: Path, certificate: x509.Certificate) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="session")
def release_keys(tmp_path_factory) -> ReleaseKeys:
    folder = tmp_path_factory.mktemp("release-keys")
    signer, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root_key, other_root_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root = _certificate("aot test root", root_key.public_key(), "aot test root", root_key, ca=True)
    other_root = _certificate("someone else's root", other_root_key.public_key(), "someone else's root", other_root_key, ca=True)
    leaf = _certificate("aot release job", signer.public_key(), "aot test root", root_key, ca=False)
    return ReleaseKeys(
        private=_write_private(folder / "signer.pem", signer),
        public=_write_public(folder / "signer.pub.pem", signer),
        other_private=_write_private(folder / "other.pem", other),
        other_public=_write_public(folder / "other.pub.pem", other),
        rsa_private=_write_private(folder / "rsa.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        encrypted_private=_write_private(folder / "encrypted.pem", ec.generate_private_key(ec.SECP256R1()), PASSWORD),
        root_certificate=_write_certificate(folder / "root.pem", root),
        other_root_certificate=_write_certificate(folder / "other-root.pem", other_root),
        leaf_certificate=_write_certificate(folder / "leaf.pem", leaf),
    )


@pytest.fixture
def signed_build(copy_build, release_keys, cli, tmp_path):
    """A copy of the session's tiny build, signed by ``release_keys.private`` with its provenance: (build, signature,
    provenance), both beside the build."""

    def sign(name: str = "build") -> tuple[Path, Path, Path]:
        build = copy_build(name)
        signature, provenance = tmp_path / f"{name}.sig", tmp_path / f"{name}.provenance.intoto.jsonl"
        result = cli("sign", build, "--key", release_keys.private, "--provenance", provenance)
        assert result.exit_code == 0, result.described
        return build, signature, provenance

    return sign
