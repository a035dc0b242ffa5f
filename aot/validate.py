"""Compare an artifact's outputs with the eager model's, output by output.

An element passes when ``|actual - expected| <= atol + rtol * |expected|``
(numpy's ``allclose`` rule). The relative error reported is
``|actual - expected| / max(|expected|, atol)``. A comparison records, for the worst output, its
max absolute and max relative error, so a failure can say exactly which
tensor drifted and by how much.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class OutputError:
    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class Comparison:
    artifact: str
    shape: str
    ok: bool
    outputs: list[OutputError] = field(default_factory=list)
    problem: str | None = None
    atol: float | None = None
    rtol: float | None = None

    @property
    def worst(self) -> OutputError | None:
        failing = [o for o in self.outputs if not o.ok] or self.outputs
        return max(failing, key=lambda o: (not o.ok, o.max_abs), default=None)

    def summary(self) -> str:
        if self.problem:
            return f"{self.artifact} at {self.shape}: {self.problem}"
        worst = self.worst
        if worst is None:
            return f"{self.artifact} at {self.shape}: no outputs"
        within = f" (atol {self.atol:g}, rtol {self.rtol:g})" if self.atol is not None and self.rtol is not None else ""
        return (
            f"{self.artifact} at {self.shape}: output '{worst.name}' shape {tuple(worst.shape)} "
            f"max abs error {worst.max_abs:.3g}, max rel error {worst.max_rel:.3g}{within}"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        worst = self.worst
        data["max_abs"] = max((o.max_abs for o in self.outputs), default=0.0)
        data["max_rel"] = max((o.max_rel for o in self.outputs), default=0.0)
        data["worst_output"] = worst.name if worst else None
        return data


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64 if value.is_floating_point() else value.dtype).numpy()
    return np.asarray(value)


def compare_outputs(
    artifact: str, shape: str, expected: dict[str, Any], actual: dict[str, Any], atol: float, rtol: float
) -> Comparison:
    missing = [name for name in expected if name not in actual]
    if missing:
        return Comparison(artifact, shape, ok=False, problem=f"missing output(s) {', '.join(missing)} (has {', '.join(actual)})", atol=atol, rtol=rtol)
    outputs = []
    for name, expected_value in expected.items():
        want, got = _as_numpy(expected_value), _as_numpy(actual[name])
        if want.shape != got.shape:
            problem = f"output '{name}' has shape {got.shape}, eager {want.shape}"
            return Comparison(artifact, shape, ok=False, outputs=outputs, problem=problem, atol=atol, rtol=rtol)
        if want.size == 0:
            outputs.append(OutputError(name, list(want.shape), 0.0, 0.0, True))
            continue
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        difference = np.abs(got64 - want64)
        finite = np.isfinite(want64) & np.isfinite(got64)
        same_nonfinite = ~finite & ((want64 == got64) | (np.isnan(want64) & np.isnan(got64)))
        difference = np.where(same_nonfinite, 0.0, np.where(finite, difference, np.inf))
        # Relative to the expected magnitude, floored at atol so near-zero elements don't explode it.
        relative = difference / np.maximum(np.abs(want64), max(atol, np.finfo(np.float64).tiny))
        ok = bool(np.all(difference <= atol + rtol * np.abs(np.where(finite, want64, 0.0))))
        outputs.append(OutputError(name, list(want.shape), float(difference.max()), float(relative.max()), ok))
    return Comparison(artifact, shape, ok=all(o.ok for o in outputs), outputs=outputs, atol=atol, rtol=rtol)
