"""The export frontend on the model zoo: ATen graphs with named dynamic dims that match eager at three shapes."""

from __future__ import annotations

import json

import pytest
import torch

from aot.errors import TraceError
from aot.tracing import Scope, export_trace
from tests.tracing.tracing_zoo import ZOO, assert_matches_eager

SPATIAL = {"resnet", "convnext"}


def dynamic_dims_for(name, example):
    dims = {}
    for input_name, value in example.items():
        dims[input_name] = {0: "batch"}
        if value.dim() == 2:
            dims[input_name][1] = "decoder_seq" if input_name.startswith("decoder_") else "seq"
        if name in SPATIAL:
            dims[input_name].update({2: "height", 3: "width"})
    return dims


@pytest.mark.full
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(ZOO))
def test_export_trace_matches_eager(name, attn):
    model, input_names, make_inputs = ZOO[name](attn)
    example = make_inputs[0]()
    gm = export_trace(model, example, dynamic_dims_for(name, example), dim_ranges={"height": (32, 512), "width": (32, 512)})

    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"][: len(input_names)] == input_names
    aten = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    assert aten, "an exported graph holds ATen ops"
    assert all(isinstance(n.meta["scope"], Scope) for n in gm.graph.nodes)
    assert any(n.meta["scope"].module_path for n in aten), "scopes come from nn_module_stack"
    report = gm.meta["trace_report"]
    json.dumps(report)
    assert report["frontend"] == "export"

    assert_matches_eager(model, gm, make_inputs)


def test_export_trace_rejects_unknown_dynamic_input():
    model, _, make_inputs = ZOO["bert"]("sdpa")
    with pytest.raises(TraceError, match="dynamic_dims names input 'ids'"):
        export_trace(model, make_inputs[0](), {"ids": {0: "batch"}})


def test_export_trace_uses_dim_names_and_ranges():
    model, _, make_inputs = ZOO["bert"]("sdpa")
    example = make_inputs[0]()
    dims = {name: {0: "batch", 1: "seq"} for name in example}
    gm = export_trace(model, example, dims, dim_ranges={"seq": (4, 32)})
    report = gm.meta["trace_report"]
    assert report["dim_ranges"] == {"batch": [1, 64], "seq": [4, 32]} or report["dim_ranges"]["seq"] == [4, 32]
    assert report["dynamic_dims"]["input_ids"] == {"0": "batch", "1": "seq"}


@pytest.mark.artifact
def test_a_dual_encoder_takes_its_text_towers_position_limit_as_the_sequence_range():
    import transformers

    text = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
            "max_position_embeddings": 24}
    vision = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32, "patch_size": 8}
    config = transformers.SiglipConfig(text_config=text, vision_config=vision)
    assert getattr(config, "max_position_embeddings", None) is None, "precondition: the limit lives in text_config only"
    torch.manual_seed(0)
    model = transformers.SiglipModel(config).eval()

    def inputs(batch, sequence):
        generator = torch.Generator().manual_seed(batch * 100 + sequence)
        return {"input_ids": torch.randint(0, 99, (batch, sequence), generator=generator),
                "pixel_values": torch.randn(batch, 3, 32, 32, generator=generator)}

    dims = {"input_ids": {0: "batch", 1: "seq"}, "pixel_values": {0: "batch"}}
    graph_module = export_trace(model, inputs(2, 16), dims)

    assert graph_module.meta["trace_report"]["dim_ranges"]["seq"] == [2, 24]
    assert_matches_eager(model, graph_module, [lambda: inputs(1, 5), lambda: inputs(3, 24)])
