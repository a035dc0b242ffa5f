"""`aot sign --provenance`: SLSA v1 provenance in a DSSE envelope, checked here with cryptography alone."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
from urllib.parse import quote

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec


def _envelope(path):
    lines = path.read_text().splitlines()
    assert len(lines) == 1, "one envelope, one line"
    return json.loads(lines[0])


def _pae(payload_type: str, body: bytes) -> bytes:
    # DSSE v1: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, written out here independently of aot.release.dsse.
    return b" ".join([b"DSSEv1", str(len(payload_type.encode())).encode(), payload_type.encode(), str(len(body)).encode(), body])


def test_the_envelope_verifies_with_the_public_key_and_names_the_manifest_and_the_installed_tools(signed_build, release_keys):
    build, _, provenance = signed_build()
    envelope = _envelope(provenance)
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    body = base64.b64decode(envelope["payload"])
    public_key = serialization.load_pem_public_key(release_keys.public.read_bytes())
    [signature] = envelope["signatures"]
    public_key.verify(base64.b64decode(signature["sig"]), _pae(envelope["payloadType"], body), ec.ECDSA(hashes.SHA256()))
    other = serialization.load_pem_public_key(release_keys.other_public.read_bytes())
    with pytest.raises(InvalidSignature):
        other.verify(base64.b64decode(signature["sig"]), _pae(envelope["payloadType"], body), ec.ECDSA(hashes.SHA256()))

    statement = json.loads(body)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    manifest_sha256 = hashlib.sha256((build / "manifest.json").read_bytes()).hexdigest()
    assert {"name": "manifest.json", "digest": {"sha256": manifest_sha256}} in statement["subject"]

    definition = statement["predicate"]["buildDefinition"]
    uris = {entry.get("uri") for entry in definition["resolvedDependencies"]}
    for tool in ("torch", "transformers"):
        assert f"pkg:pypi/{tool}@{quote(importlib.metadata.version(tool), safe='')}" in uris
    manifest = json.loads((build / "manifest.json").read_text())
    assert definition["externalParameters"]["resolvedRecipe"] == manifest["recipe"]["resolved"]
    assert definition["externalParameters"]["recipe"]["digest"] == {"sha256": manifest["recipe"]["sha256"]}
    weights = {entry["name"]: entry["digest"]["sha256"] for entry in definition["resolvedDependencies"] if "digest" in entry}
    assert weights["graph_module/weights.safetensors"] == manifest["artifacts"]["graph_module/weights.safetensors"]["sha256"]

    run = statement["predicate"]["runDetails"]
    assert run["builder"]["id"] == f"aot@{manifest['versions']['aot']}"
    assert run["metadata"]["startedOn"] <= run["metadata"]["finishedOn"]
    byproducts = {entry["name"]: json.loads(base64.b64decode(entry["content"])) for entry in run["byproducts"]}
    assert manifest["validation"] and byproducts["validation.json"] == manifest["validation"]


def test_aot_verify_checks_the_provenance(signed_build, release_keys, cli):
    build, _, provenance = signed_build()
    result = cli("verify", build, "--public-key", release_keys.public, "--provenance", provenance)
    assert result.exit_code == 0, result.described
    assert f"{provenance} names that manifest" in result.stdout and "aot@" in result.stdout


def test_an_altered_provenance_is_exit_7(signed_build, release_keys, cli):
    build, _, provenance = signed_build()
    envelope = _envelope(provenance)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["runDetails"]["builder"]["id"] = "someone-else"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    altered = provenance.with_name("altered.intoto.jsonl")
    altered.write_text(json.dumps(envelope) + "\n")
    result = cli("verify", build, "--public-key", release_keys.public, "--provenance", altered)
    assert result.exit_code == 7, result.described
    assert str(altered) in result.stderr and "no signature verifies" in result.stderr


def test_the_provenance_of_another_build_is_exit_7(signed_build, copy_build, release_keys, cli, tmp_path):
    build, _, _ = signed_build()
    other = copy_build("other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["name"] = "another build"  # another manifest; its files still match it
    (other / "manifest.json").write_text(json.dumps(manifest, indent=2))
    signed_other = cli("sign", other, "--key", release_keys.private, "--provenance", tmp_path / "other.intoto.jsonl")
    assert signed_other.exit_code == 0, signed_other.described
    result = cli("verify", build, "--public-key", release_keys.public, "--provenance", tmp_path / "other.intoto.jsonl")
    assert result.exit_code == 7, result.described
    assert "other.intoto.jsonl" in result.stderr and "not of this directory's" in result.stderr
