"""``aot validate DIR``: every file against the manifest, then every artifact against the eager model.

The directory's integrity first (:mod:`aot.directory.integrity`), then the numerics, with nothing from DIR run
before its hash matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aot.builder.checks import generation_reference, saved_graph_module_opener, validate_artifacts
from aot.builder.stages import Progress, Stages
from aot.directory.open import open_build
from aot.gates.accuracy import AccuracyResult, make_gate
from aot.gates.compare import Comparison, eager_outputs, eager_runner, raise_on_failure
from aot.inputs import onnx_input_names, shape_cases
from aot.models import load_model
from aot.process.memory import release_freed_memory
from aot.recipe.plan import DeploymentPlan


@dataclass
class DirectoryReport:
    directory: str
    manifest_sha256: str
    files_checked: int = 0
    validation: list[Comparison] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    generation: list[Any] = field(default_factory=list)  # a decoder step's GenerationCheck per artifact and prompt

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation + self.accuracy + self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "manifest_sha256": self.manifest_sha256,
            "files_checked": self.files_checked,
            "validation": [c.to_json() for c in self.validation],
            "accuracy": [a.to_json() for a in self.accuracy],
            "generation": [g.to_json() for g in self.generation],
        }


def validate_directory(
    directory: str | Path,
    recipe_path: str | Path | None = None,
    expect_sha256: str | None = None,
    progress: Progress | None = None,
    trust_code: bool = False,
) -> DirectoryReport:
    """``aot validate DIR``: every file against the manifest, then every artifact against eager.

    Nothing from DIR is imported or run before its hash matched. The recipe is the one given, else
    the file at the path the manifest records while it is still the recipe built, else the directory's copy; its sha256 must be
    the manifest's. A recipe's ``model.factory`` is code: see docs/deploy.md, "Trust".
    """
    stage = Stages(progress)
    with stage("check_files"):
        opened = open_build(directory, expect_sha256, trust_code)
        opened.require_consent("aot validate")
    directory, integrity = opened.directory, opened.integrity
    plan = opened.plan(recipe_path)
    with stage("check_tokenizer"):
        check_deployment_preprocessing(plan.deployment, directory, integrity.manifest)
    with stage("load_model"):
        model = load_model(plan.model)
        cases = shape_cases(plan.inputs, model)
        onnx_names = onnx_input_names(plan.inputs, model)
    with stage("eager_outputs"):
        expected = [eager_outputs(model, case.inputs) for case in cases]
        gate = make_gate(plan.validation.gate, eager_runner(model), model)
        generation = generation_reference(plan.validation.generation, model)
    del model
    release_freed_memory()
    report = DirectoryReport(str(directory), integrity.manifest_sha256, integrity.files_checked)
    report.validation, report.accuracy = validate_artifacts(
        plan.validation, cases, expected, directory, stage, integrity.sha256_of, gate, onnx_names
    )
    if generation is not None:
        with stage("validate_generation"):
            report.generation = generation.check_files(directory, saved_graph_module_opener(integrity.sha256_of))
    raise_on_failure(report.validation, report.accuracy + report.generation)
    return report


def check_deployment_preprocessing(plan: DeploymentPlan, directory: Path, manifest: dict) -> None:
    """The tokenizer the directory ships encodes the build's texts as the recipe's own tokenizer does, and its image
    processor gives pixels of the shape the build takes (exit 5 if not)."""
    from aot.bundle import DEPLOYMENT_KEY, check_shipped_processor, check_shipped_tokenizer, takes_pixels
    from aot.models import load_tokenizer

    deployment = manifest.get(DEPLOYMENT_KEY) or {}
    if deployment.get("processor") and takes_pixels(plan):
        check_shipped_processor(plan, directory)
    if not deployment.get("tokenizer") or plan.tokenizer is None:
        return
    check_shipped_tokenizer(plan, directory, load_tokenizer(plan.tokenizer))
