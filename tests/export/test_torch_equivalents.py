"""transformers leaves with a torch-only form: RMS norms become torch.nn.RMSNorm, checked numerically."""

from __future__ import annotations

import pytest
import torch
import transformers

from aot.errors import ExportError
from aot.export import save_graph_module
from aot.tracing import symbolic_trace
from aot.tracing.outputs import flatten_outputs
from tests.export.isolated import run_isolated
from tests.export.models import WeightNormConv, text_inputs


def _tiny_llama() -> transformers.LlamaModel:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    )
    return transformers.LlamaModel(config).eval()


@pytest.mark.artifact
def test_llama_rms_norms_become_torch_rms_norm_and_run_standalone(tmp_path):
    model = _tiny_llama()
    gm = symbolic_trace(model, input_names=["input_ids", "attention_mask"])
    rms_leaves = [n for n in gm.graph.nodes if n.op == "call_module" and "RMSNorm" in type(gm.get_submodule(n.target)).__name__]
    assert rms_leaves, "the tracer keeps Llama's RMS norms as leaves"
    save_graph_module(gm, tmp_path / "gm")
    source = (tmp_path / "gm" / "module.py").read_text()
    assert "torch.nn.RMSNorm(32, eps=" in source and "import transformers" not in source
    _assert_standalone_matches_eager(model, tmp_path, tolerance=1e-5)


def _assert_standalone_matches_eager(model, tmp_path, tolerance: float) -> None:
    """``tmp_path / "gm"`` run in a process without transformers, against ``model`` at three shapes."""
    cases = [text_inputs(b, s) for b, s in ((2, 7), (1, 3), (3, 12))]
    results = run_isolated({"model": (tmp_path / "gm", cases)}, tmp_path)["model"]
    for inputs, raw in zip(cases, results):
        with torch.no_grad():
            expected = flatten_outputs(model(**inputs))
        for name, value in expected.items():
            torch.testing.assert_close(flatten_outputs(raw)[name], value, atol=tolerance, rtol=tolerance)


class ScaledByTwoPlusWeight(torch.nn.Module):
    """An RMS norm look-alike scaling by 2 + w: neither w nor 1 + w as an RMSNorm weight computes it."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size))
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (2 + self.weight)


class UsesNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = ScaledByTwoPlusWeight(8)

    def forward(self, x):
        return self.norm(x)


def test_rms_norm_lookalike_with_other_math_is_rejected(tmp_path):
    gm = symbolic_trace(UsesNorm(), input_names=["x"], leaf_modules=(ScaledByTwoPlusWeight,))
    assert any(n.op == "call_module" and n.target == "norm" for n in gm.graph.nodes)
    with pytest.raises(ExportError, match="node 'norm' calls module 'norm'.*no torch-only form"):
        save_graph_module(gm, tmp_path / "gm")


@pytest.mark.artifact
def test_gemma_rms_norms_with_weight_offset_by_one_save_and_run_standalone(tmp_path):
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, use_cache=False, attn_implementation="eager",
    )
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():  # Gemma's norm weights start at 0, where w and 1 + w differ most; give them values
        for module in model.modules():
            if type(module).__name__ == "Gemma2RMSNorm":
                module.weight.uniform_(-0.5, 0.5)
    gm = symbolic_trace(model, input_names=["input_ids", "attention_mask"])
    norms = [n.target for n in gm.graph.nodes if n.op == "call_module" and type(gm.get_submodule(n.target)).__name__ == "Gemma2RMSNorm"]
    assert norms, "precondition: the tracer keeps Gemma2's RMS norms as leaves"

    save_graph_module(gm, tmp_path / "gm")
    assert "import transformers" not in (tmp_path / "gm" / "module.py").read_text()
    _assert_standalone_matches_eager(model, tmp_path, tolerance=1e-4)


def test_a_weight_norm_parametrized_conv_is_saved_as_a_plain_conv_holding_the_computed_weight(tmp_path):
    from aot.export import load_standalone

    torch.manual_seed(0)
    model = WeightNormConv().eval()
    assert type(model.conv).__name__ == "ParametrizedConv1d", "precondition: the leaf is parametrized"
    gm = symbolic_trace(model, input_names=["x"], dummy_inputs={"x": torch.randn(2, 8, 11)})
    assert any(n.op == "call_module" and n.target == "conv" for n in gm.graph.nodes), "precondition: the conv is a leaf call"

    save_graph_module(gm, tmp_path / "gm")

    source = (tmp_path / "gm" / "module.py").read_text()
    assert "torch.nn.Conv1d(" in source
    from safetensors import safe_open

    with safe_open(str(tmp_path / "gm" / "weights.safetensors"), "pt") as saved:
        assert sorted(saved.keys()) == ["conv.bias", "conv.weight"], "the computed weight, not weight_norm's g and v"
    loaded = load_standalone(tmp_path / "gm")
    assert type(loaded.conv) is torch.nn.Conv1d
    for length in (11, 3, 40):
        x = torch.randn(3, 8, length)
        with torch.no_grad():
            torch.testing.assert_close(flatten_outputs(loaded(x=x))["output"], model(x), rtol=1e-6, atol=1e-6)
