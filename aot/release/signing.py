"""``aot sign``'s signature: an OpenSSF Model Signing (OMS) signature over every file of a directory.

model-signing does the work, offline, through its public API: ``hashing.Config`` hashes every file (SHA-256, file
by file), ``signing.Config().use_elliptic_key_signer`` or ``use_certificate_signer`` signs the in-toto statement of
those digests, and the result is a Sigstore bundle (a DSSE envelope and the verification material: the key's hash,
or the certificate chain). Keyless signing (Sigstore's default, which needs the network and an OIDC identity) is
never configured: a signer is always set before ``sign``, so model-signing's lazy default never runs.

Left out of the hashing: the release files (:data:`aot.release.paths.RELEASE_FILE_NAMES`), so that a signature or
provenance kept inside the directory never covers itself; the signature records them (``ignore_paths``) and
model-signing's verifier leaves them out again. Git's files are *not* left out (model-signing's default is to), so
the signature covers everything else the directory holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from aot.release.dependency import load_model_signing
from aot.release.keys import SigningKey
from aot.release.paths import RELEASE_FILE_NAMES


@dataclass(frozen=True)
class Certificate:
    """The certificate form: the signing (leaf) certificate and the chain up to a root, PEM files."""

    leaf: Path
    chain: tuple[Path, ...] = ()


def hashing_config(library: ModuleType):
    """model-signing's hashing of a build directory: every file by SHA-256, the release files left out."""
    return library.hashing.Config().set_ignored_paths(paths=list(RELEASE_FILE_NAMES), ignore_git_paths=False)


def sign_files(directory: Path, signature: Path, key: SigningKey, certificate: Certificate | None = None) -> None:
    """Write the OMS signature of ``directory`` to ``signature`` (a path :func:`aot.release.files.written_whole` gave)."""
    library = load_model_signing("aot sign")
    config = library.signing.Config().set_hashing_config(hashing_config(library))
    if certificate is None:
        # The password goes as bytes: model-signing 1.1.1 annotates it str but hands it to cryptography's
        # load_pem_private_key, which takes bytes only (a str fails with TypeError).
        config.use_elliptic_key_signer(private_key=key.path, password=key.password)
    else:
        # model-signing's certificate signer opens the key without a password: an encrypted key is refused before this.
        config.use_certificate_signer(private_key=key.path, signing_certificate=certificate.leaf,
                                      certificate_chain=list(certificate.chain))
    config.sign(directory, signature)
