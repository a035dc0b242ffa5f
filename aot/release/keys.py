"""Signing keys and certificates read once, with a one-line error naming the file (RecipeError, exit 2).

model-signing reads the same files again and would raise a bare ``ValueError``/``TypeError`` (or sign nothing and
fail late); reading them here first turns each bad input into a sentence before anything is hashed or written:
a missing file, a file that is not PEM, an encrypted key without its password or with the wrong one, a key that is
not elliptic-curve (OMS signs with ECDSA on P-256, P-384 or P-521 only), a certificate for another key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from aot.errors import RecipeError

# The curves model-signing accepts (its _check_supported_ec_key), by the name cryptography gives them.
SUPPORTED_CURVES = ("secp256r1", "secp384r1", "secp521r1")
PASSWORD_HINT = "--password or $AOT_SIGNING_KEY_PASSWORD"


@dataclass(frozen=True)
class SigningKey:
    """A private key that can sign, and the password that opened it (None: not encrypted)."""

    path: Path
    private_key: ec.EllipticCurvePrivateKey
    password: bytes | None

    @property
    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self.private_key.public_key()


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the key's PEM SubjectPublicKeyInfo: the hint model-signing puts in an OMS bundle, reused as the DSSE
    keyid of the provenance so both files name their key the same way."""
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _read(path: Path, what: str) -> bytes:
    if not path.is_file():
        raise RecipeError(f"{path}: {what} not found" if not path.exists() else f"{path}: {what} is not a file")
    try:
        return path.read_bytes()
    except OSError as error:
        raise RecipeError(f"{path}: cannot read the {what} ({error.strerror or error})") from None


def _check_curve(path: Path, key: object, what: str) -> None:
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        kind = type(key).__name__.removeprefix("_").removesuffix("PrivateKey").removesuffix("PublicKey") or type(key).__name__
        raise RecipeError(f"{path}: the {what} is {kind}, not elliptic-curve: OpenSSF model signing takes P-256, P-384 or P-521")
    if key.curve.name not in SUPPORTED_CURVES:
        raise RecipeError(f"{path}: the {what} is on {key.curve.name}: OpenSSF model signing takes P-256, P-384 or P-521")


def _parse_private_key(path: Path, data: bytes, secret: bytes | None) -> object:
    """cryptography's reading of the key; TypeError (a password missing, or given to a key without one) passes."""
    try:
        return serialization.load_pem_private_key(data, secret)
    except ValueError as error:
        if secret is not None and "decrypt" in str(error).lower():  # "Bad decrypt. Incorrect password?"
            raise RecipeError(f"{path}: wrong password for the private key ({PASSWORD_HINT})") from None
        raise RecipeError(f"{path}: not a PEM private key") from None
    except UnsupportedAlgorithm as error:
        raise RecipeError(f"{path}: a private key of a kind cryptography cannot read ({error})") from None


def load_signing_key(path: str | Path, password: str | None = None) -> SigningKey:
    """The PEM private key at ``path``, opened with ``password`` where it is encrypted (a password given for a key that
    is not encrypted is ignored: a CI job may set the variable for every key)."""
    path = Path(path)
    data = _read(path, "private key")
    secret = password.encode("utf-8") if password else None
    try:
        key = _parse_private_key(path, data, secret)
    except TypeError:
        if secret is None:  # "Password was not given but private key is encrypted"
            raise RecipeError(f"{path}: the private key is encrypted: give its password ({PASSWORD_HINT})") from None
        key, secret = _parse_private_key(path, data, None), None  # "Password was given but private key is not encrypted"
    _check_curve(path, key, "private key")
    return SigningKey(path, key, secret)


def load_public_key(path: str | Path) -> ec.EllipticCurvePublicKey:
    """The PEM public key at ``path`` (SubjectPublicKeyInfo, as ``openssl ec -pubout`` writes it)."""
    path = Path(path)
    data = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        hint = " (that is a private key: give its public half, openssl ec -pubout)" if b"PRIVATE KEY" in data else ""
        raise RecipeError(f"{path}: not a PEM public key{hint}") from None
    _check_curve(path, key, "public key")
    return key


def check_certificate(certificate: str | Path, chain: tuple[str | Path, ...], key: SigningKey) -> None:
    """The signing certificate is PEM and certifies ``key``'s public half; every chain file holds PEM certificates."""
    path = Path(certificate)
    try:
        leaf = x509.load_pem_x509_certificate(_read(path, "certificate"))
    except ValueError:
        raise RecipeError(f"{path}: not a PEM certificate") from None
    if leaf.public_key() != key.public_key:
        raise RecipeError(f"{path}: certifies another key than {key.path}")
    _check_chain_files(chain)


def check_certificate_chain(chain: tuple[str | Path, ...]) -> None:
    """A verifier's chain of trust: at least one file, each of PEM certificates. Empty is a usage error: model-signing
    would fall back to the system's web roots, which certify no one's private signing key."""
    if not chain:
        raise RecipeError("--certificate-chain: give the root (and intermediate) certificates the signing certificate chains to")
    _check_chain_files(chain)


def _check_chain_files(chain: tuple[str | Path, ...]) -> None:
    for link in map(Path, chain):
        try:
            x509.load_pem_x509_certificates(_read(link, "certificate chain"))
        except ValueError:
            raise RecipeError(f"{link}: not a PEM certificate chain") from None
