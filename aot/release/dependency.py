"""The ``sign`` extra: ``model-signing``, imported on first use, with a one-line answer where it is missing.

``pip install 'aot[sign]'`` installs ``model-signing>=1.1.1,<1.2`` and ``pyopenssl``. model-signing 1.1.1 imports
pyOpenSSL (``model_signing/_signing/sign_certificate.py``: ``from OpenSSL import crypto``, imported by
``model_signing.signing`` whatever the signing method) without declaring it: sigstore 4, through which it used to
arrive, no longer requires it. That is the same kind of break as sigstore/model-transparency#531 (sigstore 4.0
stopped pulling in ``sigstore_protobuf_specs``, which model-signing imported undeclared); no issue of its own was
found for pyOpenSSL, and the upstream source still imports it undeclared. Hence the extra names both.
"""

from __future__ import annotations

from types import ModuleType

from aot.errors import RecipeError

INSTALL_HINT = "pip install 'aot[sign]'"


def load_model_signing(command: str) -> ModuleType:
    """The ``model_signing`` package (its ``signing``, ``verifying`` and ``hashing`` loaded); RecipeError (exit 2) when
    it or pyOpenSSL is not installed, naming what is missing and the extra that installs it."""
    try:
        import model_signing as library
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying  # noqa: F401  (loaded for the caller)
    except ImportError as error:
        missing = getattr(error, "name", None) or str(error)
        raise RecipeError(f"{command} needs model-signing and pyOpenSSL ({missing} is not installed): {INSTALL_HINT}") from None
    return library
