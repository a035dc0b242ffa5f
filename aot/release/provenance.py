"""SLSA v1 provenance of a build directory, as an in-toto Statement v1 (``aot sign --provenance``).

model-signing signs a model's files but writes no build provenance, so aot writes it itself: where the build came
from, with what, and how it was judged, for the ``manifest.json`` it names (the manifest lists every other file's
sha256, so the one digest pins them all). Its envelope and signature are :mod:`aot.release.dsse`'s.

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "manifest.json", "digest": {"sha256": ...}},       # the directory, through its manifest
                 {"name": DIR, "digest": {"sha256": ...}}],                 # OMS's model digest, from the signature
     "predicateType": "https://slsa.dev/provenance/v1",
     "predicate": {
       "buildDefinition": {
         "buildType": BUILD_TYPE,
         "externalParameters": {"recipe": {path, digest, overrides}, "resolvedRecipe": {...}},
         "internalParameters": {"manifestVersion", "toolVersions" (the manifest's), "times", "lockfile"},
         "resolvedDependencies": [pkg:pypi/NAME@VERSION for every installed distribution,
                                  each weight and tokenizer file with its sha256 as the manifest records it]},
       "runDetails": {
         "builder": {"id": "aot@VERSION"},
         "metadata": {"startedOn", "finishedOn"},
         "byproducts": [validation.json, accuracy.json, generation.json: the manifest's figures]}}}

What it cannot say, and why: the manifest records no clock time, so ``startedOn``/``finishedOn`` are when
``aot sign`` ran (``internalParameters.times`` says so, and ``buildSeconds`` gives the build's own duration); the
distributions are those installed where ``aot sign`` runs (a tool whose version differs from the manifest's record
carries the manifest's in ``annotations.builtWith``); and requirements.lock is not a dependency, since pip records no
constraints file in what it installs and aot cannot tell whether one was used (the pins above name every version
the lock would).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from aot.compat.window import installed_distributions

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# aot's build type: an aot build directory made by `aot build RECIPE` (docs/release.md#provenance defines its fields).
BUILD_TYPE = "urn:aot:build:v1"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".data", ".gguf", ".pt2", ".npz")
FIGURES = ("validation", "accuracy", "generation")  # the manifest's judgements of the artifacts, as byproducts
TIMES = "startedOn and finishedOn are when aot sign ran: the manifest records no clock time"
LOCKFILE = ("not recorded: pip keeps no record of a constraints file, so whether requirements.lock was used cannot "
            "be told; resolvedDependencies pins every installed version instead")


class ProvenanceError(ValueError):
    """A statement that is not aot's provenance, or not of this directory (the caller names the file)."""


@dataclass(frozen=True)
class SignedModel:
    """The OMS signature's subject: the directory's name and the sha256 over every file's digest."""

    name: str
    sha256: str


def purl(name: str, version: str) -> str:
    """The package URL of a PyPI distribution: the name normalised (PEP 503), the version percent-encoded."""
    return f"pkg:pypi/{re.sub(r'[-_.]+', '-', name).lower()}@{quote(version, safe='')}"


def utc(moment: datetime) -> str:
    """RFC 3339 in UTC, to the second, as SLSA's timestamps are written."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance_statement(manifest: dict[str, Any], manifest_name: str, manifest_sha256: str, model: SignedModel,
                         started: datetime, finished: datetime) -> dict[str, Any]:
    """The in-toto statement of the module docstring, for a build whose manifest (parsed and checked) is given."""
    recipe = manifest.get("recipe") or {}
    versions = manifest.get("versions") or {}
    aot_version = versions.get("aot") or installed_distributions().get("aot", "unknown")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": manifest_name, "digest": {"sha256": manifest_sha256}},
            {"name": model.name, "digest": {"sha256": model.sha256}},
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "recipe": {"path": recipe.get("path"), "digest": {"sha256": recipe.get("sha256")},
                               "overrides": list(recipe.get("overrides") or [])},
                    "resolvedRecipe": recipe.get("resolved"),
                },
                "internalParameters": {
                    "manifestVersion": manifest.get("manifest_version"),
                    "toolVersions": versions,
                    "buildSeconds": ((manifest.get("run") or {}).get("stages_s") or {}).get("total"),
                    "times": TIMES,
                    "lockfile": LOCKFILE,
                },
                "resolvedDependencies": _distributions(versions) + _model_files(manifest),
            },
            "runDetails": {
                "builder": {"id": f"aot@{aot_version}"},
                "metadata": {"startedOn": utc(started), "finishedOn": utc(finished)},
                "byproducts": [_figures(name, manifest[name]) for name in FIGURES if manifest.get(name)],
            },
        },
    }


def _distributions(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    dependencies = []
    for name, version in installed_distributions().items():
        entry: dict[str, Any] = {"uri": purl(name, version), "name": name}
        built_with = recorded.get(name)
        if built_with and built_with != version:
            entry["annotations"] = {"builtWith": built_with}
        dependencies.append(entry)
    return dependencies


def _model_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The weight files (by suffix) and the shipped tokenizer's files, with the digests the manifest records."""
    tokenizer = set((manifest.get("deployment") or {}).get("tokenizer") or [])
    files = []
    for relative, recorded in sorted((manifest.get("artifacts") or {}).items()):
        role = "tokenizer" if relative in tokenizer else "weights" if relative.endswith(WEIGHT_SUFFIXES) else None
        if role:
            files.append({"name": relative, "digest": {"sha256": recorded["sha256"]}, "annotations": {"role": role}})
    return files


def _figures(name: str, value: Any) -> dict[str, Any]:
    content = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return {"name": f"{name}.json", "mediaType": "application/json", "digest": {"sha256": hashlib.sha256(content).hexdigest()},
            "content": base64.b64encode(content).decode("ascii")}


@dataclass(frozen=True)
class ProvenanceSummary:
    """What ``aot verify --provenance`` reports."""

    builder: str
    build_type: str
    dependencies: int
    packages: int
    started_on: str
    finished_on: str


def check_statement(statement: dict[str, Any], manifest_name: str, manifest_sha256: str) -> ProvenanceSummary:
    """ProvenanceError unless ``statement`` is SLSA v1 provenance naming this manifest's sha256 as a subject."""
    if statement.get("_type") != STATEMENT_TYPE:
        raise ProvenanceError(f"not an in-toto Statement v1 (_type {statement.get('_type')!r})")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise ProvenanceError(f"not SLSA v1 provenance (predicateType {statement.get('predicateType')!r})")
    named = [subject for subject in statement.get("subject") or [] if isinstance(subject, dict) and subject.get("name") == manifest_name]
    if not named:
        raise ProvenanceError(f"names no {manifest_name} among its subjects")
    digest = (named[0].get("digest") or {}).get("sha256")
    if digest != manifest_sha256:
        raise ProvenanceError(f"is the provenance of {manifest_name} sha256 {digest}, not of this directory's {manifest_sha256}")
    predicate = statement.get("predicate") or {}
    definition, run = predicate.get("buildDefinition") or {}, predicate.get("runDetails") or {}
    dependencies = definition.get("resolvedDependencies") or []
    metadata = run.get("metadata") or {}
    return ProvenanceSummary(
        builder=str((run.get("builder") or {}).get("id")),
        build_type=str(definition.get("buildType")),
        dependencies=len(dependencies),
        packages=sum(1 for entry in dependencies if str(entry.get("uri", "")).startswith("pkg:pypi/")),
        started_on=str(metadata.get("startedOn")),
        finished_on=str(metadata.get("finishedOn")),
    )
