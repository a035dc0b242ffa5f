"""The GraphModule artifact: torch-only code + safetensors + meta, loaded with and without aot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.fx
from transformers.activations import GELUActivation, QuickGELUActivation
from transformers.pytorch_utils import Conv1D

from aot.errors import ExportError
from aot.export import load, save_graph_module
from aot.tracing.outputs import flatten_outputs

from . import models
from .isolated import run_isolated


class LeafTracer(torch.fx.Tracer):
    """Keeps the given classes as call_module leaves, as a frontend's leaf policy would."""

    def __init__(self, leaves: tuple[type, ...]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, module, qualified_name):
        return isinstance(module, self.leaves) or super().is_leaf_module(module, qualified_name)


def trace_with_leaves(model: torch.nn.Module, *leaves: type) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(model, LeafTracer(leaves).trace(model), type(model).__name__)


class GPT2Block(torch.nn.Module):
    """transformers' Conv1D (a transposed Linear) and GELU modules as leaves, with tied output weights."""

    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(12, 6)
        self.act = GELUActivation()
        self.c_proj = Conv1D(6, 12)
        self.embed = torch.nn.Embedding(10, 6)
        self.unembed = torch.nn.Linear(6, 10, bias=False)
        self.unembed.weight = self.embed.weight  # tied, as in language-model heads

    def forward(self, ids):
        hidden = self.c_proj(self.act(self.c_fc(self.embed(ids))))
        return self.unembed(hidden)


def gpt2_block() -> GPT2Block:
    torch.manual_seed(0)
    return GPT2Block().eval()


def _assert_close(expected, actual, label: str) -> None:
    want, got = flatten_outputs(expected), flatten_outputs(actual)
    assert list(got) == list(want), f"{label}: output names {list(got)} != {list(want)}"
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{label} {name}: {m}")


def _cases():
    """(key, eager model, graph builder, inputs at three shapes)."""
    bert = models.tiny_bert()
    resnet = models.tiny_resnet()
    convnet = models.convnet()
    block = gpt2_block()
    text = [models.text_inputs(b, s) for b, s in models.TEXT_SHAPES]
    images = [models.image_inputs(b, s) for b, s in models.IMAGE_SHAPES]
    return {
        "convnet_fx": (convnet, lambda: torch.fx.symbolic_trace(convnet), [models.convnet_inputs(b, s) for b, s in models.CONVNET_SHAPES]),
        "bert_fx": (bert, lambda: models.fx_graph(bert, ["input_ids", "attention_mask"]), text),
        "bert_export": (bert, lambda: models.export_graph(bert, text[0], models.TEXT_DIMS), text),
        "resnet_export": (
            resnet,
            lambda: models.export_graph(resnet, images[0], {"pixel_values": {0: "batch", 2: "height", 3: "width"}}, min_size=16),
            images,
        ),
        "gpt2_block_fx": (block, lambda: trace_with_leaves(block, Conv1D, GELUActivation), [{"ids": torch.randint(0, 10, (b, 5))} for b in (1, 2, 3)]),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every case saved once: {key: (eager model, graph module, directory, inputs)}."""
    root = tmp_path_factory.mktemp("graph_modules")
    result = {}
    for key, (model, build, inputs) in _cases().items():
        gm = build()
        directory = root / key
        paths = save_graph_module(gm, directory)
        assert [p.name for p in paths] == ["module.py", "weights.safetensors", "meta.json"]
        result[key] = (model, gm, directory, inputs)
    return result


@pytest.fixture(scope="module")
def isolated_outputs(saved, tmp_path_factory):
    jobs = {key: (directory, inputs) for key, (_, _, directory, inputs) in saved.items()}
    return run_isolated(jobs, tmp_path_factory.mktemp("isolated"))


CASE_KEYS = ["convnet_fx", "bert_fx", "bert_export", "resnet_export", "gpt2_block_fx"]


@pytest.mark.artifact
@pytest.mark.parametrize("key", CASE_KEYS)
def test_loads_with_torch_alone_and_matches_eager(saved, isolated_outputs, key):
    model, _, _, inputs = saved[key]
    assert len(isolated_outputs[key]) == len(inputs) >= 3
    for case, got in zip(inputs, isolated_outputs[key]):
        with torch.no_grad():
            _assert_close(model(**case), got, f"{key} standalone at {[tuple(t.shape) for t in case.values()]}")


@pytest.mark.artifact
@pytest.mark.parametrize("key", CASE_KEYS)
def test_aot_load_rebuilds_the_same_graph(saved, key):
    model, gm, directory, inputs = saved[key]
    reloaded = load(directory)
    assert isinstance(reloaded, torch.fx.GraphModule)
    assert [n.name for n in reloaded.graph.nodes] == [n.name for n in gm.graph.nodes]
    assert [n.op for n in reloaded.graph.nodes] == [n.op for n in gm.graph.nodes]
    # The code is the same for every case: a Conv1D leaf comes back as its Linear stand-in under the same name.
    assert reloaded.code == gm.code
    for case in inputs:
        with torch.no_grad():
            _assert_close(model(**case), reloaded(**case), f"{key} aot.export.load")


def test_no_pickle_and_no_aot_in_the_artifact(saved):
    for key, (_, _, directory, _) in saved.items():
        source = (directory / "module.py").read_text()
        for forbidden in ("import aot", "from aot", "import transformers", "from transformers", "pickle.", "import pickle", "torch.load(", "import safetensors"):
            assert forbidden not in source, f"{key}/module.py mentions {forbidden!r}"
        header_size = int.from_bytes((directory / "weights.safetensors").read_bytes()[:8], "little")
        header = json.loads((directory / "weights.safetensors").read_bytes()[8 : 8 + header_size])
        assert header["__metadata__"] == {"format": "pt"}
        compile(source, str(directory / "module.py"), "exec")


def test_fx_graph_keeps_copied_aot_function_and_scope(saved):
    _, gm, directory, _ = saved["bert_fx"]
    copied = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__module__.startswith("aot.")]
    assert copied, "precondition: the fx trace of BERT calls a pure-torch aot function"
    source = (directory / "module.py").read_text()
    assert f"def {copied[0].target.__name__}(" in source
    reloaded = load(directory)
    for before, after in zip(gm.graph.nodes, reloaded.graph.nodes):
        assert after.meta.get("scope") == before.meta.get("scope")
        assert type(after.meta.get("scope")) is type(before.meta.get("scope"))


@pytest.mark.artifact
def test_export_graph_returns_a_dict_in_place_of_model_output(saved, isolated_outputs):
    model, gm, _, inputs = saved["bert_export"]
    assert type(gm(**inputs[0])).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert isinstance(isolated_outputs["bert_export"][0], dict)
    assert list(isolated_outputs["bert_export"][0]) == ["last_hidden_state", "pooler_output"]


def test_stand_ins_and_tied_weights(saved):
    _, gm, directory, _ = saved["gpt2_block_fx"]
    assert isinstance(gm.c_fc, Conv1D) and isinstance(gm.act, GELUActivation), "precondition: third-party leaves"
    source = (directory / "module.py").read_text()
    assert "torch.nn.Linear(in_features=6, out_features=12, bias=True)  # stands in for transformers" in source
    assert "'unembed.weight': 'embed.weight'" in source
    header_size = int.from_bytes((directory / "weights.safetensors").read_bytes()[:8], "little")
    stored = json.loads((directory / "weights.safetensors").read_bytes()[8 : 8 + header_size])
    assert "unembed.weight" not in stored  # tied: stored once, under embed.weight
    assert stored["c_fc.weight"]["shape"] == [12, 6]  # Conv1D's [in, out] weight, transposed for the Linear
    reloaded = load(directory)
    assert isinstance(reloaded.c_fc, torch.nn.Linear)
    assert reloaded.unembed.weight is reloaded.embed.weight


def test_meta_round_trip(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    for index, node in enumerate(gm.graph.nodes):
        node.meta["merge_linears"] = {"group": index, "members": ("a", "b"), "dtype": torch.float16, "ratio": 0.5}
        node.meta["not_json"] = object()  # dropped, not fatal
    gm.meta["recipe"] = "tiny"
    save_graph_module(gm, tmp_path)
    reloaded = load(tmp_path)
    assert reloaded.meta["recipe"] == "tiny"
    for before, after in zip(gm.graph.nodes, reloaded.graph.nodes):
        assert after.name == before.name
        assert after.meta["merge_linears"] == before.meta["merge_linears"]
        assert isinstance(after.meta["merge_linears"]["members"], tuple)
        assert "not_json" not in after.meta
    document = json.loads((tmp_path / "meta.json").read_text())
    conv = next(node for node in document["nodes"] if node["name"] == "conv")
    assert conv["meta"]["nn_module_stack"] == {"conv": {"__tuple__": ["conv", "torch.nn.modules.conv.Conv2d"]}}


def test_shapes_and_dtypes_from_val(saved):
    _, gm, directory, _ = saved["bert_export"]
    val = next(node for node in gm.graph.nodes if node.name == "input_ids").meta["val"]
    assert all(isinstance(size, torch.SymInt) for size in val.shape), "precondition: batch and sequence are dynamic"
    # torch.export names the symbols (s0, s43, ...) as it likes: compare with its names, not fixed ones.
    symbols = [str(size) for size in val.shape]
    document = json.loads((directory / "meta.json").read_text())
    values = {node["name"]: node["value"] for node in document["nodes"]}
    assert values["input_ids"]["dtype"] == "int64"
    assert values["input_ids"]["shape"] == symbols


class Custom(torch.nn.Module):
    def forward(self, x):
        return x * 2


class WithCustomLeaf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.special = Custom()
        self.act = QuickGELUActivation()

    def forward(self, x):
        return self.act(self.special(x))


def test_leaf_without_torch_form_fails(tmp_path):
    gm = trace_with_leaves(WithCustomLeaf(), Custom)
    with pytest.raises(ExportError, match=r"node 'special' calls module 'special' of class .*Custom, which has no torch-only form"):
        save_graph_module(gm, tmp_path / "custom")
    gm = trace_with_leaves(WithCustomLeaf(), QuickGELUActivation)
    with pytest.raises(ExportError, match=r"node 'act' .*QuickGELUActivation"):
        save_graph_module(gm, tmp_path / "quick_gelu")
    assert not (tmp_path / "custom").exists()
    assert not (tmp_path / "quick_gelu").exists()


def third_party_function(x):
    return x + 1


torch.fx.wrap("third_party_function")


class CallsThirdParty(torch.nn.Module):
    def forward(self, x):
        return third_party_function(x)


def test_function_outside_torch_and_aot_fails(tmp_path):
    gm = torch.fx.symbolic_trace(CallsThirdParty())
    assert any(n.target is third_party_function for n in gm.graph.nodes), "precondition: a wrapped call_function"
    with pytest.raises(ExportError, match=r"node 'third_party_function' calls .*third_party_function, which has no torch-only form"):
        save_graph_module(gm, tmp_path)


@torch.library.custom_op("aot_export_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


class CallsCustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aot_export_test.double(x)


def test_custom_operator_fails(tmp_path):
    gm = torch.fx.symbolic_trace(CallsCustomOp())
    with pytest.raises(ExportError, match=r"node 'double' calls .*aot_export_test.*registered outside torch"):
        save_graph_module(gm, tmp_path)


def test_missing_tensor_is_reported(tmp_path):
    import safetensors.torch

    gm = torch.fx.symbolic_trace(models.convnet())
    save_graph_module(gm, tmp_path)
    tensors = safetensors.torch.load_file(tmp_path / "weights.safetensors")
    del tensors["fc.bias"]
    safetensors.torch.save_file(tensors, tmp_path / "weights.safetensors")
    with pytest.raises(ExportError, match=r"weights.safetensors holds no tensor for fc.bias"):
        load(tmp_path)


def test_saving_twice_in_one_process_is_identical(tmp_path):
    gm = torch.fx.symbolic_trace(models.convnet())
    first = [p.read_bytes() for p in save_graph_module(gm, tmp_path / "a")]
    second = [p.read_bytes() for p in save_graph_module(gm, tmp_path / "b")]
    assert first == second


def test_save_leaves_no_temporary_files(tmp_path: Path):
    gm = torch.fx.symbolic_trace(models.convnet())
    save_graph_module(gm, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "module.py", "weights.safetensors"]


def test_a_weights_file_the_disk_cannot_hold_is_an_export_error_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)  # the library's own error type, not an OSError
    with pytest.raises(ExportError, match=r"cannot write the graph artifact in .*No space left on device"):
        save_graph_module(torch.fx.symbolic_trace(models.convnet()), tmp_path)
    assert list(tmp_path.iterdir()) == []


class ProductOfSizes(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], math.prod(x.shape[1:]))  # math is autowrapped: a call_function on traced sizes


def test_an_autowrapped_math_call_saves_and_runs_at_other_shapes(tmp_path):
    from aot.tracing import symbolic_trace

    gm = symbolic_trace(ProductOfSizes(), ["x"], dummy_inputs={"x": torch.randn(2, 3, 4)})
    wrapped = [node for node in gm.graph.nodes if node.meta.get("is_wrapped")]
    assert [node.target for node in wrapped] == [math.prod], "precondition: fx writes a module-level wrap() for it"

    save_graph_module(gm, tmp_path)

    assert "torch.fx._symbolic_trace.wrap" not in (tmp_path / "module.py").read_text()
    assert all(node.meta["is_wrapped"] for node in wrapped), "the caller's graph is as it was"
    x = torch.randn(3, 5, 2)
    torch.testing.assert_close(load(tmp_path)(x=x), x.reshape(3, 10))
