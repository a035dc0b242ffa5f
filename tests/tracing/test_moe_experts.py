"""Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE) trace on both frontends and build end to end.

transformers' default experts implementation (``grouped_mm``) groups tokens by expert with
data-dependent sizes and an operator registered outside torch; aot traces the experts with
transformers' ``batched_mm`` instead, which is the same maths in plain torch ops. Routing
depends on the data, so every check runs at several shapes with other tokens.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import transformers as tf

from aot.builder.spine import build
from aot.tracing import export_trace, symbolic_trace
from aot.tracing.model_state import TRACEABLE_EXPERTS
from tests.tracing.tracing_zoo import (
    EXPORT_DIMS,
    TEXT_SHAPES,
    VOCAB,
    _text_inputs,
    assert_built_and_validated,
    assert_matches_eager,
    unpadded_token_inputs,
)

_NAMES = ["input_ids", "attention_mask"]
_CONFIGS = {
    "mixtral": (tf.MixtralConfig, tf.MixtralModel, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeModel, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                                                        "shared_expert_intermediate_size": 24}),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeModel, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24}),
}


def _moe(name: str) -> torch.nn.Module:
    config_class, model_class, experts = _CONFIGS[name]
    config = config_class(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa", **experts)
    torch.manual_seed(0)
    return model_class(config).eval()


def _routed_experts(model: torch.nn.Module, inputs: dict) -> set[int]:
    """The experts the first layer's router picks for these tokens (a precondition: routing differs by input)."""
    picked = []
    gate = next(module for name, module in model.named_modules() if name.endswith("layers.0.mlp.gate"))
    handle = gate.register_forward_hook(lambda module, args, output: picked.append(output))
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    routing = picked[0] if not isinstance(picked[0], tuple) else picked[0][-1]
    return set(routing.flatten().tolist()) if routing.dtype == torch.long else set(routing.topk(2, dim=-1).indices.flatten().tolist())


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(_CONFIGS))
def test_fx_traces_the_experts_with_batched_mm_and_matches_eager_at_three_shapes(name):
    model = _moe(name)
    implementation = model.config._experts_implementation
    assert implementation != TRACEABLE_EXPERTS, f"precondition: the model's own experts implementation is {implementation}"
    shapes = [lambda b=b, s=s: _text_inputs(_NAMES, b, s) for b, s in TEXT_SHAPES]
    assert len(_routed_experts(model, shapes[2]())) > 2, "precondition: the tokens are routed to more than two experts"

    graph_module = symbolic_trace(model, _NAMES)

    assert model.config._experts_implementation == implementation, "the model's implementation is put back"
    assert any(TRACEABLE_EXPERTS in note for note in graph_module.meta["trace_report"]["notes"])
    targets = {str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"}
    assert any("bmm" in target for target in targets) and not any("grouped_mm" in target for target in targets), targets
    assert_matches_eager(model, graph_module, shapes, atol=1e-5)


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(_CONFIGS))
def test_export_traces_the_experts_and_matches_eager_at_three_shapes(name):
    model = _moe(name)
    graph_module = export_trace(model, unpadded_token_inputs(2, 16), EXPORT_DIMS)

    targets = {str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"}
    assert not any("transformers" in target or "grouped_mm" in target for target in targets), targets
    shapes = [lambda b=b, s=s: unpadded_token_inputs(b, s) for b, s in TEXT_SHAPES]
    assert_matches_eager(model, graph_module, shapes, atol=1e-5)


@pytest.mark.artifact
def test_a_mixtral_recipe_builds_and_validates_both_artifacts(tmp_path):
    recipe = tmp_path / "mixtral.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        description: tiny Mixtral, 4 experts, top 2
        model:
          config: {{model_type: mixtral, vocab_size: {VOCAB}, hidden_size: 32, intermediate_size: 40, num_hidden_layers: 2,
                    num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, num_local_experts: 4,
                    num_experts_per_tok: 2}}
          class: MixtralModel
          seed: 0
          attn_implementation: sdpa
        inputs:
          dims:
            batch: {{size: 2, dynamic: true, min: 1, max: 8}}
            sequence: {{size: 16, dynamic: true, min: 2, max: 64}}
          tensors:
            - {{name: input_ids, shape: [batch, sequence], dtype: int64}}
            - {{name: attention_mask, shape: [batch, sequence], dtype: int64}}
        """))

    report = build(str(recipe), tmp_path / "out")

    assert_built_and_validated(report)
