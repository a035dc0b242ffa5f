"""The public interface of the fx frontend: names, metadata, report, options and errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from aot.errors import TraceError
from aot.tracing import HFTracer, Scope, disable_hooked_forward, symbolic_trace
from aot.tracing.torch_functions import bidirectional_attention_mask
from aot.tracing.outputs import flatten_outputs
from tests.tracing.tracing_zoo import ZOO, assert_matches_eager

BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


@pytest.fixture(scope="module")
def bert():
    return ZOO["bert"]("sdpa")


@pytest.fixture(scope="module")
def bert_gm(bert):
    model, names, _ = bert
    return symbolic_trace(model, names)


@pytest.mark.artifact
def test_placeholders_are_the_input_names_and_gm_takes_keywords(bert, bert_gm):
    model, names, make_inputs = bert
    assert [n.target for n in bert_gm.graph.nodes if n.op == "placeholder"] == names
    assert_matches_eager(model, bert_gm, make_inputs)


def test_output_names_match_eager(bert, bert_gm):
    model, _, make_inputs = bert
    inputs = make_inputs[0]()
    assert list(flatten_outputs(bert_gm(**inputs))) == list(flatten_outputs(model(**inputs)))
    assert list(flatten_outputs(bert_gm(**inputs))) == ["last_hidden_state", "pooler_output"]


def test_every_node_has_a_scope_and_tensor_nodes_a_fake_value(bert_gm):
    nodes = list(bert_gm.graph.nodes)
    linears = [n for n in nodes if n.op == "call_module" and n.target.endswith("attention.self.query")]
    assert len(linears) == 2
    for node in nodes:
        scope = node.meta["scope"]
        assert isinstance(scope, Scope) and isinstance(scope.module_type, str)
    for node in linears:
        assert node.meta["scope"] == Scope(node.target, "torch.nn.modules.linear.Linear")
        assert isinstance(node.meta["val"], FakeTensor) and node.meta["val"].shape == (2, 16, 32)
    view = next(n for n in nodes if n.op == "call_method" and n.target == "view")
    assert view.meta["scope"] == Scope(
        "encoder.layer.0.attention.self", "transformers.models.bert.modeling_bert.BertSelfAttention"
    )
    assert nodes[0].meta["scope"] == Scope("", "transformers.models.bert.modeling_bert.BertModel")
    json.dumps([list(n.meta["scope"]) for n in nodes])


def test_trace_report(bert_gm):
    report = bert_gm.meta["trace_report"]
    json.dumps(report)
    assert report["frontend"] == "fx"
    assert report["input_names"] == BERT_INPUTS
    assert "torch.nn.modules.linear.Linear" in report["leaf_modules"]
    assert report["baked_constants"] == []
    decision = next(d for d in report["decisions"] if "q_length > 1" in d["expression"])
    assert decision["file"].endswith("sdpa_attention.py") and decision["value"] is True and decision["line"] > 0
    assert 0 < report["duration_s"] < 30


@pytest.mark.artifact
def test_default_input_names_and_seeded_dummy_inputs(bert):
    model, _, _ = bert
    first, second = symbolic_trace(model), symbolic_trace(model)
    assert first.meta["trace_report"]["input_names"] == BERT_INPUTS
    assert first.meta["trace_report"]["input_shapes"]["input_ids"] == [2, 16]
    assert first.code == second.code


def test_mask_builder_is_a_pure_torch_leaf_function(bert_gm):
    targets = [n.target for n in bert_gm.graph.nodes if n.op == "call_function"]
    assert bidirectional_attention_mask in targets
    assert "transformers" not in bert_gm.code


def test_bad_input_name_is_named(bert):
    model, _, _ = bert
    with pytest.raises(TraceError, match=r"model BertModel has no input 'foo'; its inputs are: input_ids, attention_mask"):
        symbolic_trace(model, ["input_ids", "foo"])


def test_arguments_of_the_wrong_kind_are_a_type_error_saying_so(bert):
    model, _, _ = bert
    assert isinstance(symbolic_trace(model, ["input_ids"]), torch.fx.GraphModule)  # precondition: the names trace
    with pytest.raises(TypeError, match=r"^symbolic_trace traces a torch.nn.Module, not str$"):
        symbolic_trace("bert-base-uncased")
    with pytest.raises(TypeError, match=r"^input_names is a sequence of names, not one string: \['input_ids'\]\?$"):
        symbolic_trace(model, "input_ids")  # list() of it would be ['i', 'n', ...]


def test_missing_dummy_input_is_named(bert):
    model, _, make_inputs = bert
    with pytest.raises(TraceError, match="no value for input 'token_type_ids'"):
        symbolic_trace(model, BERT_INPUTS, dummy_inputs={"input_ids": torch.ones(2, 4, dtype=torch.long),
                                                         "attention_mask": torch.ones(2, 4, dtype=torch.long)})


@pytest.mark.artifact
@pytest.mark.parametrize(
    "spec",
    [
        "BertLayer",
        "transformers.models.bert.modeling_bert.BertLayer",
        "encoder.layer.0",
        pytest.param("class", id="class-object"),
    ],
)
def test_leaf_modules_by_class_name_path_or_qualified_name(bert, spec):
    from transformers.models.bert.modeling_bert import BertLayer

    model, names, make_inputs = bert
    gm = symbolic_trace(model, names, leaf_modules=[BertLayer if spec == "class" else spec])
    calls = [n.target for n in gm.graph.nodes if n.op == "call_module" and n.target.startswith("encoder.layer.")]
    expected = ["encoder.layer.0"] if spec == "encoder.layer.0" else ["encoder.layer.0", "encoder.layer.1"]
    assert [t for t in calls if t.count(".") == 2] == expected
    assert_matches_eager(model, gm, make_inputs[:2])


def test_unknown_leaf_module_path_is_an_error(bert):
    model, names, _ = bert
    with pytest.raises(TraceError, match="leaf_modules entry 'encoder.layers.0'"):
        symbolic_trace(model, names, leaf_modules=["encoder.layers.0"])


@pytest.mark.artifact
def test_default_hf_leaves_conv1d_and_rmsnorm():
    gpt2, names, _ = ZOO["gpt2"]("sdpa")
    llama, llama_names, _ = ZOO["llama"]("sdpa")
    gpt2_leaves = symbolic_trace(gpt2, names).meta["trace_report"]["leaf_modules"]
    llama_leaves = symbolic_trace(llama, llama_names).meta["trace_report"]["leaf_modules"]
    assert "transformers.pytorch_utils.Conv1D" in gpt2_leaves
    assert "transformers.models.llama.modeling_llama.LlamaRMSNorm" in llama_leaves


@pytest.mark.artifact
@pytest.mark.parametrize("as_string", [False, True])
def test_autowrap_functions_become_single_nodes(as_string):
    from transformers.models.llama import modeling_llama

    model, names, make_inputs = ZOO["llama"]("sdpa")
    spec = "transformers.models.llama.modeling_llama:apply_rotary_pos_emb" if as_string else modeling_llama.apply_rotary_pos_emb
    gm = symbolic_trace(model, names, autowrap_functions=[spec])
    wrapped = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is modeling_llama.apply_rotary_pos_emb]
    assert len(wrapped) == 2  # one per layer
    assert_matches_eager(model, gm, make_inputs[:2])


def test_bad_autowrap_function_is_an_error(bert):
    model, names, _ = bert
    with pytest.raises(TraceError, match="autowrap_functions entry 'nowhere.at_all:fn' cannot be imported"):
        symbolic_trace(model, names, autowrap_functions=["nowhere.at_all:fn"])


def test_tracer_cls_is_used(bert):
    class CountingTracer(HFTracer):
        created = 0

        def create_node(self, *args, **kwargs):
            CountingTracer.created += 1
            return super().create_node(*args, **kwargs)

    model, names, _ = bert
    gm = symbolic_trace(model, names, tracer_cls=CountingTracer)
    assert CountingTracer.created >= len(gm.graph.nodes)


class _Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.ones(3))

    def forward(self, x, y=None):
        out = torch.relu(self.linear(x)) * self.scale
        return out.flatten(1) if y is None else out + y


def test_plain_module_behaves_like_torch_fx():
    model = _Plain()
    ours, reference = symbolic_trace(model), torch.fx.symbolic_trace(model)
    assert [(n.op, str(n.target)) for n in ours.graph.nodes] == [(n.op, str(n.target)) for n in reference.graph.nodes]
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(ours(x, y), model(x, y))
    torch.testing.assert_close(ours(x, y), reference(x, y))
    assert ours.graph.find_nodes(op="call_module", target="linear")[0].meta["scope"] == Scope(
        "linear", "torch.nn.modules.linear.Linear"
    )


def test_plain_module_with_concrete_args_and_dummy_inputs():
    model = _Plain()
    gm = symbolic_trace(model, concrete_args={"y": None})
    torch.testing.assert_close(gm(torch.ones(2, 4)), model(torch.ones(2, 4)))
    gm = symbolic_trace(model, ["x", "y"], dummy_inputs={"x": torch.randn(2, 4), "y": torch.randn(2, 3)})
    assert gm.graph.find_nodes(op="call_module", target="linear")[0].meta["val"].shape == (2, 3)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    torch.testing.assert_close(gm(x=x, y=y), model(x, y))


def test_disable_hooked_forward_restores_hooks_even_on_error():
    model = _Plain()

    def hooked(*args, **kwargs):
        raise RuntimeError("accelerate hook")

    model.linear._hf_hook = object()
    model.linear._old_forward = model.linear.forward
    model.linear.forward = hooked
    with pytest.raises(ValueError):
        with disable_hooked_forward(model):
            assert model.linear.forward == model.linear._old_forward
            model(torch.ones(1, 4))
            raise ValueError("inside")
    assert model.linear.forward is hooked
    gm = symbolic_trace(model, ["x"], dummy_inputs={"x": torch.ones(1, 4)})
    assert model.linear.forward is hooked
    expected = (torch.relu(model.linear._old_forward(torch.ones(3, 4))) * model.scale).flatten(1)
    with disable_hooked_forward(gm):  # the GraphModule's copy of the module keeps its hook
        torch.testing.assert_close(gm(x=torch.ones(3, 4)), expected)


def test_graph_module_survives_deepcopy_and_save_load(bert, bert_gm, tmp_path):
    import copy

    model, _, make_inputs = bert
    copied = copy.deepcopy(bert_gm)
    torch.save(bert_gm, tmp_path / "gm.pt")
    loaded = torch.load(tmp_path / "gm.pt", weights_only=False)  # fx re-traces the code with HFTracer
    assert copied.meta["trace_report"] == bert_gm.meta["trace_report"]
    assert_matches_eager(model, copied, make_inputs[:1])
    assert_matches_eager(model, loaded, make_inputs[:1])
