"""Tiny models that recipes in the tests build through `model.factory`, each failing at one stage of the build."""

from __future__ import annotations

import torch


class DataDependentBranch(torch.nn.Module):
    """Branches on a tensor's value: torch.export cannot decide the branch for every input."""

    def __init__(self, features: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)
        return -self.linear(x)


def data_dependent_branch(features: int = 4) -> torch.nn.Module:
    return DataDependentBranch(features)


class MismatchedMatmul(torch.nn.Module):
    """Multiplies its input by a matrix of the wrong size: the fx frontend's fake-valued trace fails on the shapes."""

    def __init__(self, features: int = 4):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(features + 1, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def mismatched_matmul(features: int = 4) -> torch.nn.Module:
    return MismatchedMatmul(features)


class RunningMaximum(torch.nn.Module):
    """Uses aten.cummax, which torch.onnx's exporter has no ONNX translation for: the ONNX export fails."""

    def __init__(self, features: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(self.linear(x), dim=-1).values


def running_maximum(features: int = 4) -> torch.nn.Module:
    return RunningMaximum(features)


class SignGate(torch.nn.Module):
    """Flips its input's sign depending on its values: a branch torch.export cannot take for every input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


class GatedLinear(torch.nn.Module):
    """A linear layer behind a :class:`SignGate`. With the gate a leaf, the fx frontend keeps it as one call
    and succeeds; the branch is left to the ONNX export's own torch.export, which fails on it."""

    def __init__(self, features: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.gate = SignGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.linear(x))


def gated_linear(features: int = 4) -> torch.nn.Module:
    return GatedLinear(features)
