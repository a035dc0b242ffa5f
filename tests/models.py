"""Small modules that recipes in the tests build through `model.factory`."""

from __future__ import annotations

import torch


class NoisyLinear(torch.nn.Module):
    """Adds fresh noise on every call, so no artifact can ever match eager: a guaranteed validation failure."""

    def __init__(self, features: int = 8):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.randn_like(x)


def noisy_linear(features: int = 8) -> torch.nn.Module:
    return NoisyLinear(features)
