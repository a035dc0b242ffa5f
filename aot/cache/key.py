"""A build's cache key: the full sha256 of a canonical JSON document of everything that makes its bytes.

The document holds:

- ``recipe``: the manifest's own ``recipe`` section (the path as given, the file's sha256, the recipe
  resolved with every default and ``--set`` override, the overrides as given), since the manifest records it;
- ``inputs``: the sha256 of every file the build reads from disk, named by the recipe key that names it
  (``model.pretrained``, a tokenizer, ``validate.accuracy.data``, calibration texts, fidelity prompts); a
  directory by each file under it, so a model shipped in an installed package is hashed as a local one. Names,
  not absolute paths: the same project checked out elsewhere gives the same key;
- ``factory``: the source file of ``model.factory``'s module (not what it imports in turn);
- ``aot``: its version and the sha256 of its own source files, so an edited checkout is a new key;
- ``distributions``: every installed distribution's version (``importlib.metadata``);
- ``platform``: what selects the kernels that compute the artifacts' bytes: the Python version, the
  architecture, the CPU features torch dispatches on (``torch.cpu.get_capabilities``, flags only: not the
  core count or cache sizes, so machines of one ISA share entries), the recipe's device and, for CUDA, the
  device's name and compute capability.

The digest is never truncated (an 8-hex key collides: Olive #1936); entries name it in full.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from aot.compat.window import installed_distributions, installed_version
from aot.directory.manifest import sha256_file
from aot.recipe.plan import BuildPlan

KEY_FORMAT = 1  # raised when the document changes meaning, so older entries stop matching


@dataclass(frozen=True)
class BuildKey:
    digest: str  # 64 hex digits
    document: dict[str, Any] = field(repr=False)  # what was hashed, kept in the entry to explain a miss

    @property
    def short(self) -> str:
        """For people (a log line, ``aot cache ls``); entries and lookups use the whole digest."""
        return self.digest[:12] + "…"


def canonical_json(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def build_key(
    plan: BuildPlan,
    *,
    distributions: dict[str, str] | None = None,
    platform_facts: dict[str, Any] | None = None,
    aot_source: dict[str, str] | None = None,
) -> BuildKey:
    """The key of ``plan`` on this machine; the keyword arguments replace what is read from it (tests inject them)."""
    document = {
        "key_format": KEY_FORMAT,
        "recipe": plan.recipe.to_manifest(),
        "inputs": input_digests(plan),
        "factory": factory_digest(plan.model.spec.factory),
        "aot": aot_source if aot_source is not None else aot_source_digest(),
        "distributions": distributions if distributions is not None else installed_distributions(),
        "platform": platform_facts if platform_facts is not None else platform_of(plan.model.spec.device),
    }
    return BuildKey(hashlib.sha256(canonical_json(document)).hexdigest(), document)


def input_paths(plan: BuildPlan) -> dict[str, Path]:
    """``{recipe key: path}`` of every file or directory the build reads, the plan's sections all asked."""
    found: dict[str, Path] = {}

    def add(located: Any) -> None:
        if located is not None:
            found[".".join(map(str, located.key))] = located.path

    if plan.model.pretrained is not None:
        found["model.pretrained"] = plan.model.pretrained
    add(plan.inputs.texts_tokenizer)
    add(plan.deployment.tokenizer)
    gate = plan.validation.gate
    if gate is not None:
        add(gate.tokenizer)
        if gate.data_path is not None:
            found["validate.accuracy.data"] = gate.data_path
    calibration = plan.passes.calibration
    if calibration is not None:
        add(calibration.tokenizer)
        found["generation.calibration.texts"] = calibration.texts_path
    fidelity = plan.validation.fidelity
    if fidelity is not None:
        add(fidelity.tokenizer)
        found["generation.fidelity.prompts"] = fidelity.prompts_path
    return found


def input_digests(plan: BuildPlan) -> dict[str, dict[str, str]]:
    """``{recipe key: {relative file: sha256}}``; a file's own entry is ``{"": sha256}``. Each path is read once."""
    paths = input_paths(plan)
    by_path = {path: _tree_digests(path) for path in set(paths.values())}
    return {name: by_path[path] for name, path in sorted(paths.items())}


def _tree_digests(path: Path) -> dict[str, str]:
    if path.is_file():
        return {"": sha256_file(path)}
    if not path.is_dir():
        return {}  # the build itself will name the missing path; a failed build is never stored
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {p.relative_to(path).as_posix(): sha256_file(p) for p in files}


def factory_digest(factory: str | None) -> dict[str, str] | None:
    """The sha256 of the file holding ``model.factory``'s module; None without a factory."""
    if factory is None:
        return None
    module_name = factory.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None or not origin.is_file():
        return {"module": module_name, "sha256": ""}  # the build reports the import error; it is not stored
    return {"module": module_name, "sha256": sha256_file(origin)}


@functools.cache  # the code this process runs is what it imported: later edits do not change its builds
def aot_source_digest() -> dict[str, str]:
    """aot's version and one sha256 over its source files: a version alone would not change in an editable install."""
    import aot

    root = Path(aot.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return {"version": installed_version("aot"), "source_sha256": digest.hexdigest()}


def platform_of(device: str) -> dict[str, Any]:
    """What of this machine selects the kernels a build runs for ``device`` (see the module docstring)."""
    import torch

    capabilities = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "system": platform.system(),
        "machine": platform.machine(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_features": sorted(name for name, value in capabilities.items() if value is True),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        facts["cuda"] = {
            "runtime": torch.version.cuda,
            "name": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index)),
        }
    return facts
