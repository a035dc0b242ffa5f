"""A build directory signed and verified: the OMS signature and the manifest, each checking the other.

``aot sign DIR`` (:func:`sign_build`) signs only a directory that still matches its manifest, and keeps the
signature only if it lists exactly the manifest's files at the manifest's digests; ``--provenance`` adds SLSA
provenance naming the manifest's sha256 (:mod:`aot.release.provenance`). Every bad input (a key, a path, a missing
extra) is refused before anything is hashed, and the files are written whole or not at all
(:func:`aot.release.files.written_whole`).

``aot verify DIR`` (:func:`verify_build`) checks the signature with model-signing (:mod:`aot.release.verification`),
then the directory against its manifest (:func:`aot.directory.integrity.verify_directory`) with the manifest's
sha256 *as signed* in place of ``--expect-sha256``, then the provenance's envelope and subject.

A signature that verifies with a key the user names is consent to run the directory's code:
:func:`signed_manifest_sha256` gives the signed manifest digest, which ``aot validate``, ``aot bench``, ``aot run``
and ``aot.load`` then use as ``expect_sha256`` (:mod:`aot.directory.consent`). The signature layer lies below this
one (docs/CONTRIBUTING.md), so the combination lives here.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aot.directory.integrity import IntegrityReport, expected_sha256, verify_directory
from aot.directory.manifest import MANIFEST_NAME
from aot.errors import IntegrityError, RecipeError
from aot.release.dependency import load_model_signing
from aot.release.paths import PROVENANCE_NAME, SIGNATURE_NAME, default_signature, name_inside, signature_beside


@dataclass
class SignReport:
    directory: Path
    signature: Path
    provenance: Path | None
    manifest_sha256: str
    model_digest: str
    files_signed: int
    signer: str

    def to_json(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "signature": str(self.signature),
                "provenance": str(self.provenance) if self.provenance else None, "manifest_sha256": self.manifest_sha256,
                "model_digest": self.model_digest, "files_signed": self.files_signed, "signer": self.signer}


@dataclass
class VerifyReport:
    directory: Path
    signature: Path
    manifest_sha256: str
    model_digest: str
    files_signed: int
    files_checked: int
    signer: str
    provenance: Path | None = None
    provenance_summary: Any = None  # aot.release.provenance.ProvenanceSummary

    def to_json(self) -> dict[str, Any]:
        summary = self.provenance_summary
        return {"directory": str(self.directory), "signature": str(self.signature), "ok": True,
                "manifest_sha256": self.manifest_sha256, "model_digest": self.model_digest,
                "files_signed": self.files_signed, "files_checked": self.files_checked, "signer": self.signer,
                "provenance": None if self.provenance is None else {"path": str(self.provenance), **vars(summary)}}


def _require_build(directory: Path) -> None:
    if not directory.is_dir() or not (directory / MANIFEST_NAME).is_file():
        raise RecipeError(f"{directory}: not an aot build directory (no {MANIFEST_NAME})")


def _release_path(directory: Path, path: Path, fixed_name: str, what: str) -> Path:
    """``path`` for a release file: outside ``directory``, or inside it at ``fixed_name`` only (integrity tolerates
    nothing else there)."""
    inside = name_inside(directory, path)
    if inside is not None and inside != fixed_name:
        raise RecipeError(f"{path}: inside {directory} the {what} can only be {directory / fixed_name} "
                          f"(the one name aot validate accepts beside the manifest's files)")
    return path


def sign_build(directory: str | Path, key: str | Path, *, signature: str | Path | None = None, password: str | None = None,
               certificate: str | Path | None = None, chain: tuple[str | Path, ...] = (),
               provenance: str | Path | None = None) -> SignReport:
    """Sign ``directory`` with ``key`` (or ``key`` and its ``certificate`` up ``chain``), and write its provenance."""
    directory = Path(directory)
    load_model_signing("aot sign")  # before anything else: the missing extra is the one thing to say
    from aot.release.files import written_whole
    from aot.release.keys import key_id, load_signing_key
    from aot.release.signing import sign_files
    from aot.release.verification import signed_files_of

    _require_build(directory)
    targets = _release_targets(directory, signature, provenance)
    signing_key = load_signing_key(key, password)
    signed_with = _certificate_form(signing_key, certificate, tuple(chain))
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="aot-sign-") as private:  # not inside the directory while it is checked
        unchecked = Path(private) / SIGNATURE_NAME
        sign_files(directory, unchecked, signing_key, signed_with)
        # Kept only if what was signed is what the manifest proves (exit 7 otherwise, nothing written): the files are
        # held to it by the digests model-signing just made, so each is read once and none can change in between.
        signed = signed_files_of(unchecked)
        integrity = verify_directory(directory, digest=_file_digests(signed))
        _check_signed_as_listed(directory, signed, integrity)
        signature_bytes = unchecked.read_bytes()
    with written_whole(*targets) as temporaries:
        temporaries[0].write_bytes(signature_bytes)
        if provenance is not None:
            _write_provenance(temporaries[1], integrity, signed, signing_key.private_key, started)
    signer = f"certificate {certificate}" if certificate is not None else f"key {key_id(signing_key.public_key)[:16]}"
    return SignReport(directory, targets[0], targets[1] if provenance is not None else None,
                      integrity.manifest_sha256, signed.model_digest, len(signed.files), signer)


def _release_targets(directory: Path, signature: str | Path | None, provenance: str | Path | None) -> list[Path]:
    """The signature's path (default: beside the directory) and the provenance's, each one the command may write."""
    from aot.release.files import check_writable, is_dsse_envelope, is_oms_signature

    signature_path = _release_path(directory, Path(signature) if signature else signature_beside(directory), SIGNATURE_NAME, "signature")
    check_writable(signature_path, "signature", is_oms_signature)
    if provenance is None:
        return [signature_path]
    provenance_path = _release_path(directory, Path(provenance), PROVENANCE_NAME, "provenance")
    check_writable(provenance_path, "provenance", is_dsse_envelope)
    if provenance_path.resolve() == signature_path.resolve():
        raise RecipeError(f"{provenance_path}: the signature and the provenance need two files")
    return [signature_path, provenance_path]


def _certificate_form(signing_key: Any, certificate: str | Path | None, chain: tuple[str | Path, ...]) -> Any:
    """The certificate and chain to sign with (None: the key alone), checked against the key."""
    from aot.release.keys import check_certificate
    from aot.release.signing import Certificate

    if certificate is None:
        return None
    if signing_key.password is not None:  # model-signing 1.1's certificate signer reads the key without a password
        raise RecipeError(f"{signing_key.path}: an encrypted key cannot sign with --certificate (model-signing reads it "
                          "without a password): keep it decrypted in the job's secret store instead")
    if not chain:  # model-signing 1.1 reads the chain with load_pem_x509_certificates, which refuses an empty one
        raise RecipeError(f"{certificate}: --certificate needs --chain, the certificates up to the root (the root "
                          "itself where it issued the certificate)")
    check_certificate(certificate, chain, signing_key)
    return Certificate(Path(certificate), tuple(map(Path, chain)))


def _file_digests(signed: Any) -> Callable[[str, Path], str | None] | None:
    """The signed files' digests, for verify_directory, where they are plain SHA-256 of each file, as the manifest's
    are (aot signs so; a signature made with model-signing's sharded hashing holds other digests, and the files are
    then read again)."""
    return (lambda relative, path: signed.files.get(relative)) if signed.algorithm == "sha256" else None


def _check_signed_as_listed(directory: Path, signed: Any, integrity: IntegrityReport) -> None:
    """The new signature's files must be exactly the manifest's, at its digests."""
    listed = {relative: recorded["sha256"] for relative, recorded in integrity.manifest["artifacts"].items()}
    listed[MANIFEST_NAME] = integrity.manifest_sha256
    differing = sorted(name for name in set(signed.files) | set(listed) if signed.files.get(name) != listed.get(name))
    if differing:
        raise IntegrityError(f"{directory}: the signature and {MANIFEST_NAME} disagree on {', '.join(differing)}; "
                             "nothing was written")


def _write_provenance(path: Path, integrity: IntegrityReport, signed: Any, private_key: Any, started: datetime) -> None:
    from aot.release.dsse import sign_envelope
    from aot.release.provenance import SignedModel, provenance_statement

    statement = provenance_statement(integrity.manifest, MANIFEST_NAME, integrity.manifest_sha256,
                                     SignedModel(signed.model_name, signed.model_digest), started, datetime.now(timezone.utc))
    path.write_text(json.dumps(sign_envelope(statement, private_key), separators=(",", ":")) + "\n", encoding="utf-8")


def _verified_signature(directory: Path, signature: str | Path | None, public_key: str | Path | None,
                        certificate_chain: tuple[str | Path, ...], expect_sha256: str | None, command: str) -> Any:
    """The verified signature of ``directory`` and the manifest digest it signs (checked against ``expect_sha256``)."""
    expect_sha256 = expected_sha256(expect_sha256)  # a malformed one is bad usage, before any file is read
    load_model_signing(command)
    from aot.release.verification import verify_files

    _require_build(directory)
    signature_path = Path(signature) if signature else default_signature(directory)
    signed = verify_files(directory, signature_path, Path(public_key) if public_key else None,
                          tuple(map(Path, certificate_chain)))
    manifest_sha256 = signed.files.get(MANIFEST_NAME)
    if manifest_sha256 is None:
        raise IntegrityError(f"{signature_path}: signs no {MANIFEST_NAME}: not the signature of an aot build directory")
    if expect_sha256 is not None and expect_sha256 != manifest_sha256:
        raise IntegrityError(f"{signature_path}: signs {MANIFEST_NAME} sha256 {manifest_sha256}, not the expected {expect_sha256}")
    return signed, manifest_sha256


def signed_manifest_sha256(directory: str | Path, public_key: str | Path, signature: str | Path | None = None,
                           expect_sha256: str | None = None, command: str = "--public-key") -> str:
    """The sha256 of ``directory``'s manifest.json as signed by ``public_key``'s owner, once the signature verifies
    over every file: pass it on as ``expect_sha256``, which checks the manifest and gives consent to run code."""
    return _verified_signature(Path(directory), signature, public_key, (), expect_sha256, command)[1]


def verify_build(directory: str | Path, *, signature: str | Path | None = None, public_key: str | Path | None = None,
                 certificate_chain: tuple[str | Path, ...] = (), provenance: str | Path | None = None,
                 expect_sha256: str | None = None) -> VerifyReport:
    """The signature over every file, the files against the manifest it signs, and the provenance; exit 7 at the first
    that fails, naming the file."""
    directory = Path(directory)
    signed, manifest_sha256 = _verified_signature(directory, signature, public_key, tuple(certificate_chain),
                                                  expect_sha256, "aot verify")
    integrity = verify_directory(directory, manifest_sha256, digest=_file_digests(signed))  # model-signing just hashed them
    report = VerifyReport(directory, signed.signature, integrity.manifest_sha256, signed.model_digest, len(signed.files),
                          integrity.files_checked, signed.signer)
    if provenance is not None:
        report.provenance = Path(provenance)
        report.provenance_summary = _check_provenance(report.provenance, signed.signer_key, integrity.manifest_sha256)
    return report


def _check_provenance(path: Path, public_key: Any, manifest_sha256: str) -> Any:
    from aot.release.dsse import EnvelopeError, open_envelope
    from aot.release.provenance import ProvenanceError, check_statement

    if not path.is_file():
        raise RecipeError(f"{path}: provenance not found")
    try:
        envelope = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[0])
        if not isinstance(envelope, dict):
            raise EnvelopeError("not a JSON object")
        return check_statement(open_envelope(envelope, public_key), MANIFEST_NAME, manifest_sha256)
    except (UnicodeDecodeError, IndexError, ValueError) as error:  # EnvelopeError and ProvenanceError are ValueErrors
        reason = error if isinstance(error, (EnvelopeError, ProvenanceError)) else f"not a DSSE envelope ({type(error).__name__})"
        raise IntegrityError(f"{path}: {reason}") from None
