"""What a build reports: its stages' times, passes, checks, files, memory; the CLI prints it, the manifest records it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aot.bundle import Deployment
from aot.decoding.generation_check import GenerationCheck
from aot.builder.pipeline import PassRecord
from aot.gates.accuracy import AccuracyResult
from aot.gates.compare import Comparison


@dataclass
class BuildReport:
    name: str
    output: str
    manifest_sha256: str | None = None
    stages: dict[str, float] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    validation: list[Comparison] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    trace: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    peak_rss_by_stage: dict[str, float] = field(default_factory=dict)
    onnx_fusions: dict[str, int] = field(default_factory=dict)
    onnx_lowering: list[dict[str, Any]] = field(default_factory=list)  # what the ONNX unit's lowering passes did, in order
    generation: list[GenerationCheck] = field(default_factory=list)
    deployment: Deployment | None = None
    # {artifact kind's manifest key: its manifest section}, made as the kind was written: what its writer returned
    # names files in the staging directory, which is gone once the build is in place.
    artifact_sections: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.validation + self.accuracy + self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "output": self.output,
            "ok": self.ok,
            "manifest_sha256": self.manifest_sha256,
            "stages_s": self.stages,
            "passes": [p.to_json() for p in self.passes],
            "onnx_fusions": self.onnx_fusions,
            "onnx_lowering": self.onnx_lowering,
            "validation": [c.to_json() for c in self.validation],
            "accuracy": [a.to_json() for a in self.accuracy],
            "generation": [g.to_json() for g in self.generation],
            "files": self.files,
            "memory": self.memory,
        }
