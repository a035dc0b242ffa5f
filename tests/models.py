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


class UnmaskedMeanEmbedding(torch.nn.Module):
    """Token embeddings averaged over the whole sequence, the attention mask ignored: padding changes its answer."""

    def __init__(self, vocab: int = 64, width: int = 8):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"pooled": self.embedding(input_ids).mean(dim=1), "mask_sum": attention_mask.sum(dim=1, keepdim=True).float()}


def unmasked_mean_embedding() -> torch.nn.Module:
    return UnmaskedMeanEmbedding()


class CountsItsTokens(torch.nn.Module):
    """Sizes a tensor by the number of real tokens: data-dependent, which no CUDA graph can capture."""

    def __init__(self, vocab: int = 64, width: int = 8):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        real = torch.nonzero(attention_mask)
        return {"hidden": self.embedding(input_ids), "real_tokens": real.float().sum(dim=0)}


def counts_its_tokens() -> torch.nn.Module:
    return CountsItsTokens()
