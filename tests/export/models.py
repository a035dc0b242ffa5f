"""Small models and inputs for the export tests, all seeded (torch.manual_seed(0))."""

from __future__ import annotations

import torch
import transformers

VOCAB = 99
TEXT_SHAPES = [(2, 7), (1, 5), (3, 12)]
IMAGE_SHAPES = [(2, 32), (1, 24), (3, 40)]
CONVNET_SHAPES = [(2, 5), (1, 8), (4, 11)]
TEXT_DIMS = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}


class ConvNet(torch.nn.Module):
    """Conv, batch norm, a Sequential of activations, a buffer, a tensor constant, nested outputs."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.fc = torch.nn.Linear(8, 4)
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 4))
        self.offset = torch.tensor(0.25)  # a plain tensor attribute: a get_attr constant

    def forward(self, x):
        features = self.norm(self.head(self.bn(self.conv(x))))
        logits = self.fc(features) * self.scale + self.offset
        return {"logits": logits, "extra": (features, torch.nn.functional.gelu(features))}


class WeightNormConv(torch.nn.Module):
    """wav2vec2's positional embedding in small: a grouped Conv1d under torch's weight_norm parametrization."""

    def __init__(self):
        super().__init__()
        conv = torch.nn.Conv1d(8, 8, kernel_size=5, padding=2, groups=2)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x))


def convnet() -> ConvNet:
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():  # non-trivial running statistics, so a lost buffer would show
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def convnet_inputs(batch: int, size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + size)
    return {"x": torch.randn(batch, 3, size, size, generator=generator)}


def tiny_bert() -> transformers.BertModel:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def text_inputs(batch: int, sequence: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + sequence)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, max(sequence // 2, 1) :] = 0  # the first row is padded
    return {"input_ids": torch.randint(3, VOCAB, (batch, sequence), generator=generator), "attention_mask": mask}


def tiny_resnet() -> transformers.ResNetModel:
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    torch.manual_seed(0)
    return transformers.ResNetModel(config).eval()


def image_inputs(batch: int, size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + size)
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}


def export_graph(model: torch.nn.Module, inputs: dict[str, torch.Tensor], dims: dict[str, dict[int, str]], min_size=1):
    """The export frontend's kind of graph: torch.export(...).module(), ATen ops and pytree in/out specs."""
    by_name: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> torch.export.Dim:
        return by_name.setdefault(name, torch.export.Dim(name, min=1 if name == "batch" else min_size, max=64))

    dynamic_shapes = {name: {axis: dim(d) for axis, d in dims[name].items()} for name in inputs}
    program = torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes, strict=False)
    return program.module()


def fx_graph(model: torch.nn.Module, input_names: list[str]):
    """The fx frontend's kind of graph: module-level, traced by aot.tracing."""
    from aot.tracing import symbolic_trace

    return symbolic_trace(model, input_names=input_names)
