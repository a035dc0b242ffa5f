"""GroupQueryAttention: repeated key/value heads disappear, the outputs stay the same in torch and in ONNX Runtime."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from torch import nn

from aot.decoding.keyword_step import DecoderStep
from aot.export.onnx_export import write_onnx
from aot.export.onnx_runtime import run_onnx
from aot.passes import GroupQueryAttention, registry
from aot.tracing import export_trace, symbolic_trace
from tests.decoding.zoo import MODELS
from tests.passes.helpers import FRONTENDS, assert_matches_eager, count_calls, fx_graph

F = nn.functional
_SDPA = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


class RepeatedHeads(nn.Module):
    """Transformers' ``repeat_kv`` before SDPA, with the variations the pass must refuse."""

    def __init__(self, times=2, value_times=None, causal=False, dropout=0.0, return_keys=False):
        super().__init__()
        self.times, self.value_times = times, value_times or times
        self.causal, self.dropout, self.return_keys = causal, dropout, return_keys

    @staticmethod
    def repeat(x, times):
        batch, heads, length, size = x.shape
        return x[:, :, None, :, :].expand(batch, heads, times, length, size).reshape(batch, heads * times, length, size)

    def forward(self, query, key, value, mask):
        keys, values = self.repeat(key, self.times), self.repeat(value, self.value_times)
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=None if self.causal else mask,
                                             dropout_p=self.dropout, is_causal=self.causal, scale=0.25)
        # Transformers reads the repeated values' head size to reshape the output: a read the pass keeps.
        out = out.transpose(1, 2).reshape(out.shape[0], -1, values.shape[-1] * out.shape[1])
        return (out, keys) if self.return_keys else out


def _attention_inputs(batch, heads, kv_heads, length, total, mask_heads=1, value_heads=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, length, 8, generator=generator)
    key = torch.randn(batch, kv_heads, total, 8, generator=generator)
    value = torch.randn(batch, value_heads or kv_heads, total, 8, generator=generator)
    mask = torch.rand(batch, mask_heads, length, total, generator=generator) > 0.3
    mask[..., -1] = True  # every row attends somewhere
    return query, key, value, mask


def _repeats(graph_module) -> int:
    return count_calls(graph_module, "expand", torch.ops.aten.expand.default)


def test_the_pass_is_registered_as_preserving_on_both_frontends():
    info = registry.get("group_query_attention")
    assert info.cls is GroupQueryAttention and info.preserves_computation
    assert all(info.supports(frontend) for frontend in FRONTENDS)


def test_repeated_heads_are_read_once_and_the_outputs_are_equal_at_several_shapes():
    module = RepeatedHeads(times=2).eval()
    graph_module = fx_graph(module, *_attention_inputs(2, 4, 2, 3, 5))
    assert _repeats(graph_module) == 2, "precondition: keys and values are repeated"

    result = GroupQueryAttention().apply(graph_module)

    assert (result.matched, result.changed) == (1, 1) and result.modified, result.notes
    attention = next(node for node in graph_module.graph.nodes if node.target in _SDPA)
    assert [arg.name for arg in attention.args[1:3]] == ["key", "value"], "the attention reads the unrepeated heads"
    assert _repeats(graph_module) == 1, "only the mask is expanded"
    shapes = [(2, 4, 2, 3, 5), (1, 4, 2, 1, 9), (3, 4, 2, 6, 6), (1, 6, 3, 2, 4)]
    assert assert_matches_eager(module, graph_module, [_attention_inputs(*shape, seed=i) for i, shape in enumerate(shapes)],
                                atol=1e-6, rtol=1e-6) == 4


@pytest.mark.parametrize(
    "module, mask_heads, reason",
    [
        (RepeatedHeads(causal=True), 1, "causal by flag"),
        (RepeatedHeads(dropout=0.1), 1, "it has dropout"),
        (RepeatedHeads(return_keys=True), 1, "also read by node"),
        (RepeatedHeads(times=4, value_times=2), 1, "keys are repeated 4 times, its values 2"),
        (RepeatedHeads(), 4, "its mask has 4 heads, not 1"),
    ],
    ids=["causal", "dropout", "keys returned", "uneven repeats", "mask per head"],
)
def test_what_grouping_would_change_is_left_alone_with_its_reason(module, mask_heads, reason):
    uneven = module.value_times != module.times  # 8 query heads over 2 key heads (x4) and 4 value heads (x2)
    inputs = _attention_inputs(2, 8, 2, 3, 5, value_heads=4) if uneven else _attention_inputs(2, 4, 2, 3, 5, mask_heads=mask_heads)
    graph_module = fx_graph(module.eval(), *inputs)
    repeats = _repeats(graph_module)
    assert repeats == 2, "precondition: keys and values are repeated"

    result = GroupQueryAttention().apply(graph_module)

    assert result.matched == 1 and result.changed == 0 and not result.modified
    assert any(reason in note for note in result.notes), result.notes
    assert _repeats(graph_module) == repeats


def _traced_step(name: str, frontend: str = "fx"):
    step = DecoderStep(MODELS[name]()).eval()
    inputs = step.case_inputs({"batch": 2, "sequence": 3, "seen": 5}, seed=0)
    if frontend == "export":
        return step, export_trace(step, inputs, dynamic_dims=step.dynamic_axes(), dim_ranges=step.dim_ranges())
    return step, symbolic_trace(step, input_names=step.input_names, dummy_inputs=inputs)


_STEP_SIZES = [{"batch": 1, "sequence": 7, "seen": 0}, {"batch": 1, "sequence": 1, "seen": 12}, {"batch": 3, "sequence": 4, "seen": 9}]


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("name", ["llama", "mistral_window_8"])
def test_a_decoder_step_attends_over_its_cache_unrepeated_with_the_same_outputs(name, frontend):
    step, graph_module = _traced_step(name, frontend)
    layers = step.decoder.num_layers
    assert step.config.num_attention_heads == 2 * step.config.num_key_value_heads, "precondition: grouped-query attention"
    repeats = _repeats(graph_module)
    assert repeats >= 2 * layers, "precondition: each layer repeats its keys and values"
    traced = copy.deepcopy(graph_module)

    result = GroupQueryAttention().apply(graph_module)

    assert result.changed == layers and not result.notes, result.notes
    assert _repeats(graph_module) == repeats - layers, "a mask expand per layer replaces the key and value repeats"
    cache_reads = (torch.cat, torch.ops.aten.cat.default, torch.ops.aten.slice.Tensor)  # export slices the cache whole first
    for attention in (node for node in graph_module.graph.nodes if node.target in _SDPA):
        assert attention.args[1].target in cache_reads and attention.args[2].target in cache_reads, attention.args[1:3]
    assert assert_matches_eager(traced, graph_module, [step.case_inputs(sizes, seed=1) for sizes in _STEP_SIZES]) == 3


@pytest.mark.artifact
def test_the_grouped_step_runs_in_onnx_runtime_like_in_torch(tmp_path):
    step, graph_module = _traced_step("llama")
    assert GroupQueryAttention().apply(graph_module).changed == step.decoder.num_layers, "precondition: rewritten"
    names = step.onnx_input_names()
    path = tmp_path / "step.onnx"
    write_onnx(graph_module, path, step.case_inputs(_STEP_SIZES[0], seed=0), step.dynamic_axes(), input_names=names,
               output_names=step.output_names)
    onnx.checker.check_model(str(path), full_check=True)
    for sizes in _STEP_SIZES:
        inputs = step.case_inputs(sizes, seed=2)
        with torch.no_grad():
            expected = graph_module(**inputs)
        actual = run_onnx(path, {names[key]: value for key, value in inputs.items()})
        for output, want in expected.items():
            torch.testing.assert_close(torch.from_numpy(actual[output]), want, atol=1e-5, rtol=1e-4, msg=f"{sizes} {output}")


def test_multi_head_attention_is_no_site():
    step, graph_module = _traced_step("gpt2")
    assert sum(node.target in _SDPA for node in graph_module.graph.nodes) == step.decoder.num_layers, "precondition: SDPA"
    result = GroupQueryAttention().apply(graph_module)
    assert (result.matched, result.changed, result.notes, result.modified) == (0, 0, [], False)
