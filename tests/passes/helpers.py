"""Graphs on both frontends, toy modules, small Hugging Face models, and numeric comparisons for the pass tests."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim
from torch.fx import GraphModule
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from aot.tracing.outputs import flatten_outputs

FRONTENDS = ("fx", "export")


def fx_graph(module: nn.Module, *inputs: torch.Tensor) -> GraphModule:
    """Module-level graph of a small module, with FakeTensor ``val`` metadata like ``aot.tracing`` records."""
    graph_module = torch.fx.symbolic_trace(module)
    FakeTensorProp(graph_module, mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    return graph_module


def export_graph(module: nn.Module, *inputs: torch.Tensor, **kwargs: torch.Tensor) -> GraphModule:
    """ATen-level graph (``torch.export(...).module()``) with every dimension dynamic where possible."""
    dynamic = lambda tensor: {index: Dim.AUTO for index in range(tensor.dim())}  # noqa: E731
    shapes_args = tuple(dynamic(tensor) for tensor in inputs)
    shapes_kwargs = {name: dynamic(tensor) for name, tensor in kwargs.items()}
    dynamic_shapes = shapes_kwargs if not inputs else shapes_args if not kwargs else None
    program = torch.export.export(module, inputs, kwargs or None, dynamic_shapes=dynamic_shapes)
    return program.module()


def graph(frontend: str, module: nn.Module, *inputs: torch.Tensor) -> GraphModule:
    return fx_graph(module, *inputs) if frontend == "fx" else export_graph(module, *inputs)


def outputs(result) -> dict[str, torch.Tensor]:
    return flatten_outputs(result)


def assert_matches_eager(
    eager: nn.Module,
    graph_module: GraphModule,
    input_sets: Iterable[Sequence[torch.Tensor] | dict[str, torch.Tensor]],
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> int:
    """Compares ``graph_module`` with ``eager`` on every input set; returns how many were compared."""
    count = 0
    with torch.no_grad():
        for inputs in input_sets:
            if isinstance(inputs, dict):
                expected, actual = outputs(eager(**inputs)), outputs(graph_module(**inputs))
            else:
                expected, actual = outputs(eager(*inputs)), outputs(graph_module(*inputs))
            assert list(expected) == list(actual), f"output names differ: {list(expected)} vs {list(actual)}"
            for name, want in expected.items():
                torch.testing.assert_close(actual[name], want, atol=atol, rtol=rtol, msg=lambda m, n=name: f"output {n}: {m}")
            count += 1
    return count


def shape_sets(make: Callable[..., torch.Tensor], shapes: Sequence[tuple[int, ...]], seed: int = 0) -> list[tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(make(*shape, generator=generator),) for shape in shapes]


def randn_sets(*shapes: tuple[int, ...]) -> list[tuple[torch.Tensor]]:
    return shape_sets(torch.randn, shapes)


def call_targets(graph_module: GraphModule) -> collections.Counter:
    """How many nodes call each function, method or module type (by class name)."""
    counter: collections.Counter = collections.Counter()
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            counter[type(graph_module.get_submodule(node.target)).__name__] += 1
        elif node.op in ("call_function", "call_method"):
            counter[node.target] += 1
    return counter


def count_calls(graph_module: GraphModule, *targets) -> int:
    """How many nodes call any of ``targets`` (functions, method names or module class names)."""
    counts = call_targets(graph_module)
    return sum(counts[target] for target in targets)


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def assert_same_tensors(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    current = module.state_dict()
    assert current.keys() == saved.keys(), f"state dict keys changed: {sorted(current.keys() ^ saved.keys())}"
    for name, tensor in saved.items():
        assert current[name].shape == tensor.shape and torch.equal(current[name], tensor), f"tensor '{name}' changed"


# -- toy modules shared by several test files -----------------------------------------------


def with_statistics(batch_norm: nn.modules.batchnorm._BatchNorm) -> nn.modules.batchnorm._BatchNorm:
    """``batch_norm`` with running statistics and affine parameters far from 0 and 1, so a wrong fold shows."""
    with torch.no_grad():
        if batch_norm.track_running_stats:
            batch_norm.running_mean.uniform_(-1, 1)
            batch_norm.running_var.uniform_(0.5, 2)
        if batch_norm.affine:
            batch_norm.weight.uniform_(0.5, 2)
            batch_norm.bias.uniform_(-1, 1)
    return batch_norm


class LinearPair(nn.Module):
    """Two linear layers reading one input (4 features), the second without bias: a merge_linears group."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 3, bias=False)

    def forward(self, x):
        return self.a(x).sum(-1) + self.b(x).sum(-1)


class SingleLinear(nn.Module):
    """One linear layer (4 features): nothing for merge_linears to merge it with."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).relu()


class ConvOutputUsedTwice(nn.Module):
    """A conv read by its batch norm and by an addition: folding the batch norm would change the addition."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = with_statistics(nn.BatchNorm2d(4))

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


# -- small Hugging Face models --------------------------------------------------------------

BERT_INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]


def tiny_bert(attn_implementation: str) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, attn_implementation=attn_implementation,
    )
    return BertModel(config).eval()


def bert_inputs(batch: int, sequence: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, sequence // 2 :] = 0  # some padding, so the attention mask matters
    return {
        "input_ids": torch.randint(0, 99, (batch, sequence), generator=generator),
        "attention_mask": mask,
        "token_type_ids": torch.zeros(batch, sequence, dtype=torch.long),
    }


BERT_SHAPES = [(1, 5), (2, 7), (3, 16)]


def tiny_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    model = ResNetModel(config).eval()
    with torch.no_grad():  # non-trivial statistics, so a wrong fold shows
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def hf_graph(frontend: str, model: nn.Module, example: dict[str, torch.Tensor]) -> GraphModule:
    if frontend == "fx":
        from aot.tracing import symbolic_trace

        return symbolic_trace(model, input_names=list(example))
    return export_graph(model, **example)
