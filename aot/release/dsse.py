"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse, protocol.md), signed and checked with an EC key.

model-signing wraps its own statement in DSSE inside a Sigstore bundle, but offers no API to sign another
statement; the provenance (:mod:`aot.release.provenance`) is therefore enveloped here, in DSSE's plain JSON form:

    {"payloadType": TYPE, "payload": base64(BODY), "signatures": [{"keyid": KEYID, "sig": base64(SIG)}]}

SIG signs the pre-authentication encoding (PAE), never the JSON, so the bytes verified are the bytes signed:

    PAE(TYPE, BODY) = "DSSEv1" SP LEN(TYPE) SP TYPE SP LEN(BODY) SP BODY

LEN is the byte length in ASCII decimal; SIG is ECDSA with SHA-256, DER-encoded, on whichever curve the key has
(P-256, P-384 or P-521), so a verifier needs no table of hashes. KEYID is the key's OMS hint
(:func:`aot.release.keys.key_id`), the same one the signature bundle names.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from aot.release.keys import key_id

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


class EnvelopeError(ValueError):
    """The envelope is malformed or its signature does not verify (the caller names the file)."""


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding of ``body`` of ``payload_type``."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def sign_envelope(statement: dict[str, Any], private_key: ec.EllipticCurvePrivateKey,
                  payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> dict[str, Any]:
    """``statement`` as compact JSON in a DSSE envelope signed by ``private_key``."""
    body = json.dumps(statement, separators=(",", ":"), sort_keys=True).encode("utf-8")
    signature = private_key.sign(pae(payload_type, body), ec.ECDSA(hashes.SHA256()))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(body).decode("ascii"),
        "signatures": [{"keyid": key_id(private_key.public_key()), "sig": base64.b64encode(signature).decode("ascii")}],
    }


def open_envelope(envelope: dict[str, Any], public_key: ec.EllipticCurvePublicKey,
                  payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> dict[str, Any]:
    """The statement inside ``envelope`` once one of its signatures verifies with ``public_key``; EnvelopeError else."""
    if envelope.get("payloadType") != payload_type:
        raise EnvelopeError(f"payloadType is {envelope.get('payloadType')!r}, not {payload_type!r}")
    try:
        body = base64.b64decode(envelope["payload"], validate=True)
        signatures = [base64.b64decode(entry["sig"], validate=True) for entry in envelope["signatures"]]
    except (KeyError, TypeError, binascii.Error) as error:
        raise EnvelopeError(f"not a DSSE envelope ({error!r})") from None
    message = pae(payload_type, body)
    for signature in signatures:
        try:
            public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        try:
            statement = json.loads(body)
        except ValueError as error:
            raise EnvelopeError(f"its payload is not JSON ({error})") from None
        if not isinstance(statement, dict):
            raise EnvelopeError("its payload is not a JSON object")
        return statement
    raise EnvelopeError("no signature verifies with the key given (another key signed it, or it was altered)")
