"""``aot verify``'s signature check: model-signing's verifier, its failures said in one line naming the file or key.

``verifying.Config().use_elliptic_key_verifier`` (or ``use_certificate_verifier``) checks the bundle's DSSE
signature with the key given (or the chain of its certificate up to the roots given), then hashes the directory
as :func:`aot.release.signing.hashing_config` does and compares every file with what was signed. Its failures
arrive as ``ValueError`` messages (a changed file, another key), cryptography's ``InvalidSignature``, pyOpenSSL's
chain errors; :func:`verify_files` turns each into an IntegrityError (exit 7) that names the files that differ,
the key, or the certificate chain.

The signature file is read once: model-signing verifies a private copy of those bytes, and what was signed (every
file's digest, above all ``manifest.json``'s, which lets the manifest check take over in
:mod:`aot.directory.signed`) is read from the same bytes, so a file swapped meanwhile changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from aot.errors import IntegrityError, RecipeError
from aot.release.dependency import load_model_signing
from aot.release.keys import check_certificate_chain, key_id, load_public_key
from aot.release.signing import hashing_config


@dataclass(frozen=True)
class SignedFiles:
    """What an OMS signature says: each file's digest, the model's digest, and who signed (once verified)."""

    signature: Path
    model_name: str
    model_digest: str  # the statement's subject: sha256 over every file's digest, in name order (OMS)
    files: dict[str, str] = field(repr=False)  # relative path -> hex digest
    algorithm: str = "sha256"
    signer_key: ec.EllipticCurvePublicKey | None = field(default=None, repr=False)  # the key that signed
    signer: str = ""  # in words: "key <id>" or "certificate <subject>"


def read_signature(signature: Path) -> bytes:
    if not signature.is_file():
        raise RecipeError(f"{signature}: signature not found (aot sign writes DIR.sig beside DIR unless --signature says where)")
    return signature.read_bytes()


def _bundle(signature: Path, data: bytes) -> dict[str, Any]:
    try:
        bundle = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        bundle = None
    if not isinstance(bundle, dict) or not isinstance(bundle.get("dsseEnvelope"), dict):
        raise IntegrityError(f"{signature}: not an OpenSSF model signature (no Sigstore bundle with a DSSE envelope)")
    return bundle


def signed_files_of(signature: Path, data: bytes | None = None, signer_key: Any = None, signer: str = "") -> SignedFiles:
    """What the statement in ``signature`` (its bytes ``data``, else read) lists; verified only if the caller did."""
    data = read_signature(signature) if data is None else data
    try:
        statement = json.loads(base64.b64decode(_bundle(signature, data)["dsseEnvelope"]["payload"], validate=True))
        subject = statement["subject"][0]
        resources = statement["predicate"]["resources"]
        files = {resource["name"]: resource["digest"] for resource in resources}
        algorithms = ",".join(sorted({resource["algorithm"] for resource in resources}))
        return SignedFiles(signature, subject.get("name", ""), subject["digest"]["sha256"], files, algorithms, signer_key, signer)
    except (KeyError, IndexError, TypeError, ValueError, binascii.Error) as error:
        raise IntegrityError(f"{signature}: not an OpenSSF model signature (its statement lacks {error!r})") from None


def verify_files(directory: Path, signature: Path, public_key: Path | None = None,
                 certificate_chain: tuple[Path, ...] = ()) -> SignedFiles:
    """Check ``signature`` over ``directory`` with ``public_key`` or, without one, ``certificate_chain``."""
    library = load_model_signing("aot verify")
    if (public_key is None) == (not certificate_chain):
        raise RecipeError("give either --public-key or --certificate-chain to check the signature with")
    key = load_public_key(public_key) if public_key is not None else None
    if key is None:
        check_certificate_chain(certificate_chain)
    data = read_signature(signature)
    bundle = _bundle(signature, data)
    _check_form(signature, bundle, by_key=key is not None)
    config = library.verifying.Config().set_hashing_config(hashing_config(library))
    if key is not None:
        config.use_elliptic_key_verifier(public_key=public_key)
        trusted = f"the key in {public_key}"
    else:
        config.use_certificate_verifier(certificate_chain=list(certificate_chain))
        trusted = f"the certificate chain in {', '.join(map(str, certificate_chain))}"
    with tempfile.TemporaryDirectory(prefix="aot-verify-") as private:
        copy = Path(private) / "signature.json"
        copy.write_bytes(data)
        try:
            config.verify(directory, copy)
        except OSError:
            raise
        except Exception as error:  # model-signing's failures have no common type: each is said in one line (exit 7)
            differences = lambda: _differences(library, directory, signed_files_of(signature, data).files)  # noqa: E731
            raise IntegrityError(_failure_line(directory, signature, trusted, error, differences)) from None
    signer_key, signer = (key, f"key {key_id(key)[:16]}") if key is not None else _leaf_certificate(signature, bundle)
    return signed_files_of(signature, data, signer_key, signer)


def _check_form(signature: Path, bundle: dict[str, Any], by_key: bool) -> None:
    """A bundle signed by a key names the key's hash; one signed by a certificate carries the chain: checking one
    with the other's means would fail deep inside model-signing, so say which it is (exit 7: it does not verify)."""
    material = bundle.get("verificationMaterial") or {}
    if by_key and "x509CertificateChain" in material:
        raise IntegrityError(f"{signature}: signed with a certificate, not a bare key: verify it with --certificate-chain")
    if not by_key and "publicKey" in material:
        raise IntegrityError(f"{signature}: signed with a bare key, not a certificate: verify it with --public-key")


def _failure_line(directory: Path, signature: Path, trusted: str, error: Exception, differences) -> str:
    message = " ".join(str(error).split())
    if message.startswith("Signature mismatch"):  # the signature is genuine; the files are not what it signs
        return f"{directory}: differs from its signature {signature}: {differences() or message}"
    if message.startswith("Key mismatch") or isinstance(error, InvalidSignature):
        return f"{signature}: not signed by {trusted} (another key signed it, or the signature was altered)"
    if type(error).__name__ == "X509StoreContextError" or "certificate" in message.lower():
        return f"{signature}: its signing certificate does not verify against {trusted} ({message or type(error).__name__})"
    if "symlink" in message:
        return f"{directory}: {message} (a build directory holds no links)"
    return f"{signature}: does not verify against {directory} ({type(error).__name__}: {message})"


def _differences(library: ModuleType, directory: Path, signed: dict[str, str]) -> str:
    """Which files differ from a genuine signature, named from model-signing's own hashing of the directory (its
    mismatch message is a list's repr, not meant to be read back)."""
    actual = {item.identifier: item.digest.digest_hex for item in hashing_config(library).hash(directory).resource_descriptors()}
    changed = sorted(name for name in set(actual) & set(signed) if actual[name] != signed[name])
    parts = [f"{', '.join(changed)} changed since signing"] if changed else []
    parts += [f"{', '.join(sorted(set(actual) - set(signed)))} not signed"] if set(actual) - set(signed) else []
    parts += [f"{', '.join(sorted(set(signed) - set(actual)))} missing"] if set(signed) - set(actual) else []
    return "; ".join(parts)


def _leaf_certificate(signature: Path, bundle: dict[str, Any]) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The signing certificate of a bundle whose chain model-signing has verified: its key and its subject."""
    try:
        raw = bundle["verificationMaterial"]["x509CertificateChain"]["certificates"][0]["rawBytes"]
        leaf = x509.load_der_x509_certificate(base64.b64decode(raw))
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise IntegrityError(f"{signature}: names no signing certificate ({error!r})") from None
    return leaf.public_key(), f"certificate {leaf.subject.rfc4514_string()}"
