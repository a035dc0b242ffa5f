"""CastPrecision: which dtypes the graph holds, numerics within bfloat16's error, the saved artifact, prepacking after it.

Error bounds. bfloat16 keeps 8 significant bits: each rounding is off by at most 2^-8 (0.39%) of
the value. A tiny BERT's output element sits behind roughly ten roundings (embeddings, weights,
each GEMM's result, residual adds, the casts around LayerNorm), whose errors partly cancel: its
largest error is about 1% of the output's largest magnitude (measured 0.7%), and the outputs
keep a cosine similarity above 0.9999 with float32's. The tests allow 3% and 0.999: a broken
cast (a weight left out, a LayerNorm fed the wrong tensor) is far beyond either.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from aot.errors import RecipeError
from aot.passes import (
    CastPrecision,
    DeadCodeElimination,
    MergeLinears,
    PrepackLinearWeights,
    RemoveDropout,
    RemoveRedundantCasts,
    registry,
)
from aot.passes.base import PassFailure
from tests.passes.helpers import (
    BERT_INPUT_NAMES,
    BERT_SHAPES,
    assert_same_tensors,
    bert_inputs,
    fx_graph,
    outputs,
    snapshot,
    tiny_bert,
)

F = nn.functional
RECIPES = Path(__file__).parents[2] / "recipes"
COSINE, RELATIVE_ERROR = 0.999, 3e-2  # see the module docstring


class Block(nn.Module):
    """Token ids and a float input; a LayerNorm module, a softmax, three linears; two float outputs."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.dense = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, ids, x):
        hidden = self.norm(self.dense(x + self.embed(ids)))
        probs = torch.softmax(self.proj(hidden), dim=-1)
        return {"hidden": hidden, "scores": self.out(probs)}


def _block_inputs(batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (batch, length), generator=generator), torch.randn(batch, length, 8, generator=generator)


def _block():
    torch.manual_seed(0)
    model = Block().eval()
    return model, fx_graph(model, *_block_inputs(2, 3))


def _node(graph_module, name):
    return next(node for node in graph_module.graph.nodes if node.name == name)


def _is_cast(node, dtype) -> bool:
    return node.op == "call_method" and node.target == "to" and node.args[1:] == (dtype,)


def _output_args(graph_module) -> dict:
    return next(node for node in graph_module.graph.nodes if node.op == "output").args[0]


def _assert_close_in_bfloat16(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, f"{name}: the output keeps its dtype"
        cosine = F.cosine_similarity(actual.flatten().double(), expected.flatten().double(), dim=0)
        relative = (actual - expected).abs().max() / expected.abs().max()
        assert cosine > COSINE and relative < RELATIVE_ERROR, f"{name}: cosine {cosine:.6f}, max relative error {relative:.4f}"
        assert not torch.equal(actual, expected), f"{name}: bit-identical to float32: the graph did not compute in bfloat16"


def test_weights_and_arithmetic_become_bfloat16_with_layer_norm_and_softmax_in_float32():
    model, graph_module = _block()
    saved = snapshot(model)
    assert {tensor.dtype for tensor in graph_module.state_dict().values()} == {torch.float32}, "precondition"
    assert _node(graph_module, "norm").op == "call_module" and _node(graph_module, "softmax").target is torch.softmax

    result = CastPrecision().apply(graph_module)

    assert result.modified and result.matched == result.changed and not result.notes, result
    dtypes = {name: tensor.dtype for name, tensor in graph_module.state_dict().items()}
    assert dtypes == {name: torch.float32 if name.startswith("norm.") else torch.bfloat16 for name in dtypes}
    ids, x = _node(graph_module, "ids"), _node(graph_module, "x")
    assert not [user for user in ids.users if user.op == "call_method"], "integer inputs are not cast"
    assert [_is_cast(user, torch.bfloat16) for user in x.users] == [True], "the float input enters in bfloat16"
    for kept in ("norm", "softmax"):
        node = _node(graph_module, kept)
        assert _is_cast(node.args[0], torch.float32) and node.meta["val"].dtype == torch.float32, kept
        assert "cast_precision" in node.meta["aot_transforms"]
    for linear in ("dense", "proj", "out"):
        assert _node(graph_module, linear).meta["val"].dtype == torch.bfloat16, "meta['val'] follows the new dtypes"
    outputs_node = _output_args(graph_module)
    assert outputs_node["hidden"] is _node(graph_module, "norm"), "a kept layer's float32 result is returned as it is"
    assert _is_cast(outputs_node["scores"], torch.float32)
    assert_same_tensors(model, saved)  # the caller's model keeps its float32 weights

    with torch.no_grad():
        for batch, length in ((1, 1), (2, 5), (4, 9)):
            inputs = _block_inputs(batch, length, seed=batch)
            _assert_close_in_bfloat16(outputs(model(*inputs)), outputs(graph_module(*inputs)))
    assert not CastPrecision().apply(graph_module).modified, "a second application finds nothing to do"


def test_float16_and_layers_kept_by_name():
    model, graph_module = _block()

    CastPrecision(dtype="float16", keep_float32=[], keep_float32_names=["ou*"])(graph_module)

    dtypes = {name: tensor.dtype for name, tensor in graph_module.state_dict().items()}
    assert dtypes == {name: torch.float32 if name.startswith("out.") else torch.float16 for name in dtypes}
    assert _is_cast(_node(graph_module, "out").args[0], torch.float32), "the kept linear reads float32"
    assert not _is_cast(_node(graph_module, "norm").args[0], torch.float32), "keep_float32 emptied: LayerNorm in float16"
    assert _output_args(graph_module)["scores"] is _node(graph_module, "out")
    with torch.no_grad():
        for batch, length in ((1, 2), (3, 4), (2, 7)):
            inputs = _block_inputs(batch, length, seed=batch)
            want, got = outputs(model(*inputs)), outputs(graph_module(*inputs))
            for name in want:  # float16 keeps 11 bits: 8 times closer than bfloat16
                torch.testing.assert_close(got[name], want[name], atol=1e-2, rtol=1e-2)


class TiedHead(nn.Module):
    """Tied input and output embeddings, a non-persistent float buffer, and a constant fx keeps as a plain attribute."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.unembed = nn.Linear(6, 10, bias=False)
        self.unembed.weight = self.embed.weight
        self.register_buffer("offset", torch.full((6,), 0.25), persistent=False)

    def forward(self, ids):
        return self.unembed(self.embed(ids) + self.offset + torch.ones(6))


def test_tied_weights_stay_tied_and_every_kind_of_tensor_is_cast():
    torch.manual_seed(0)
    model = TiedHead().eval()
    graph_module = fx_graph(model, torch.randint(0, 10, (2, 3)))
    constants = [node.target for node in graph_module.graph.nodes if node.op == "get_attr" and node.target.startswith("_tensor_constant")]
    assert len(constants) == 1, "precondition: torch.ones(6) became a constant"
    # symbolic_trace makes every tensor a persistent buffer; a frontend may keep them as the model had them
    graph_module.register_buffer("offset", graph_module.offset, persistent=False)
    setattr(graph_module, constants[0], graph_module._buffers.pop(constants[0]))  # a plain tensor attribute
    assert "offset" not in graph_module.state_dict() and constants[0] not in dict(graph_module.named_buffers())

    CastPrecision()(graph_module)

    assert graph_module.unembed.weight is graph_module.embed.weight and graph_module.embed.weight.dtype == torch.bfloat16
    assert graph_module.offset.dtype == getattr(graph_module, constants[0]).dtype == torch.bfloat16
    assert "offset" not in graph_module.state_dict(), "the buffer stays non-persistent"
    assert constants[0] not in dict(graph_module.named_buffers()), "the attribute stays an attribute"
    assert model.embed.weight.dtype == model.offset.dtype == torch.float32, "the caller's model is untouched"
    with torch.no_grad():
        for shape in ((1, 1), (2, 3), (4, 6)):
            ids = torch.randint(0, 10, shape, generator=torch.Generator().manual_seed(shape[1]))
            _assert_close_in_bfloat16({"logits": model(ids)}, {"logits": graph_module(ids)})


class ExplicitUpcast(nn.Module):
    """A model that casts to float32 itself, then feeds a linear layer: bfloat16 weights cannot take that."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)
        self.register_buffer("scale", torch.full((2,), 0.5, dtype=torch.float64))

    def forward(self, x):
        return self.second(self.first(x).float()) * self.scale


def test_a_graph_that_cannot_run_in_bfloat16_fails_naming_the_node_and_the_remedy_works():
    torch.manual_seed(0)
    model = ExplicitUpcast().eval()
    with pytest.raises(PassFailure, match=r"cannot run in bfloat16: node 'second' \(call_module second\) raised .*keep_float32_names"):
        CastPrecision().apply(fx_graph(model, torch.randn(3, 4)))

    graph_module = fx_graph(model, torch.randn(3, 4))
    result = CastPrecision(keep_float32_names=["sec*"]).apply(graph_module)

    assert result.notes == ["tensor 'scale' is torch.float64, not float32: left as it is"]
    assert graph_module.first.weight.dtype == torch.bfloat16 and graph_module.second.weight.dtype == torch.float32
    with torch.no_grad():
        x = torch.randn(5, 4)
        got, want = graph_module(x), model(x)
        assert got.dtype == torch.float64 == want.dtype
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_a_graph_without_fake_values_is_left_alone_with_the_reason():
    model, _ = _block()
    graph_module = torch.fx.symbolic_trace(model)  # no meta["val"]: the new dtypes could not be checked

    result = CastPrecision().apply(graph_module)

    assert not result.modified and result.changed == 0
    assert len(result.notes) == 1 and "cannot be recomputed on fake tensors" in result.notes[0], result.notes


def test_options_and_registration():
    info = registry.get("cast_precision")
    assert info.frontends == {"fx"} and not info.preserves_computation and not info.reversible
    assert CastPrecision().options.keep_float32 == ["LayerNorm", "layer_norm", "softmax"]
    with pytest.raises(ValidationError, match="'bfloat16' or 'float16'"):
        CastPrecision(dtype="int8")
    with pytest.raises(ValidationError, match="extra"):
        CastPrecision(keep_fp32=["LayerNorm"])


# -- a tiny BERT, traced by aot's fx tracer -------------------------------------------------


def _bert_graph(model):
    from aot.tracing import symbolic_trace

    graph_module = symbolic_trace(model, input_names=BERT_INPUT_NAMES)
    for cleanup in (MergeLinears(), RemoveDropout(), DeadCodeElimination()):
        cleanup(graph_module)
    return graph_module


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tiny_bert_within_bfloat16_error_at_three_shapes(attention):
    model = tiny_bert(attention)
    graph_module = _bert_graph(model)
    layer_norms = [n for n in graph_module.graph.nodes if n.op == "call_module" and isinstance(graph_module.get_submodule(n.target), nn.LayerNorm)]
    softmaxes = [n for n in graph_module.graph.nodes if n.op == "call_function" and n.target is F.softmax]
    assert len(layer_norms) == 5 and len(softmaxes) == (2 if attention == "eager" else 0), "precondition"

    CastPrecision()(graph_module)

    for node in layer_norms + softmaxes:
        assert node.meta["val"].dtype == torch.float32 and _is_cast(node.args[0], torch.float32), node.name
    linears = [module for module in graph_module.modules() if isinstance(module, nn.Linear)]
    assert linears and {module.weight.dtype for module in linears} == {torch.bfloat16}
    assert not RemoveRedundantCasts().apply(graph_module).modified, "meta['val'] tells the new dtypes: every cast is needed"
    with torch.no_grad():
        for batch, sequence in BERT_SHAPES:
            inputs = bert_inputs(batch, sequence)
            _assert_close_in_bfloat16(outputs(model(**inputs)), outputs(graph_module(**inputs)))


def test_saved_artifact_holds_bfloat16_weights_and_loads_with_its_marks(tmp_path):
    import safetensors

    from aot.export import load, save_graph_module
    from aot.export.graph_module_artifact import load_standalone

    model = tiny_bert("sdpa")
    plain, cast = _bert_graph(model), _bert_graph(model)
    CastPrecision()(cast)
    save_graph_module(plain, tmp_path / "float32")
    save_graph_module(cast, tmp_path / "bfloat16")

    with safetensors.safe_open(str(tmp_path / "bfloat16" / "weights.safetensors"), "pt") as weights:
        stored = {name: weights.get_slice(name).get_dtype() for name in weights.keys()}
    assert {name for name, dtype in stored.items() if dtype == "F32"} == {name for name in stored if ".LayerNorm." in name}
    assert stored["embeddings.word_embeddings.weight"] == "BF16" and stored["embeddings.position_ids"] == "I64"
    size = lambda name: (tmp_path / name / "weights.safetensors").stat().st_size  # noqa: E731
    assert size("bfloat16") < 0.6 * size("float32"), "bfloat16 halves the bytes of every weight but LayerNorm's"

    standalone, reloaded = load_standalone(tmp_path / "bfloat16"), load(tmp_path / "bfloat16")
    assert sum("cast_precision" in node.meta.get("aot_transforms", ()) for node in reloaded.graph.nodes) > 0
    with torch.no_grad():
        for batch, sequence in BERT_SHAPES:
            inputs = bert_inputs(batch, sequence)
            want = outputs(cast(**inputs))
            for runner in (standalone, reloaded):
                got = outputs(runner(**inputs))
                assert all(torch.equal(got[name], want[name]) and got[name].dtype == torch.float32 for name in want)


def test_prepacked_after_it_the_linears_run_onednn_bfloat16_gemms():
    from aot.runtime import OneDNNLinear

    model = tiny_bert("sdpa")
    graph_module = _bert_graph(model)
    CastPrecision()(graph_module)
    with torch.no_grad():
        unpacked = [outputs(graph_module(**bert_inputs(b, s))) for b, s in BERT_SHAPES]

    result = PrepackLinearWeights().apply(graph_module)

    packed = [module for module in graph_module.modules() if isinstance(module, OneDNNLinear)]
    assert result.changed == len(packed) == 9 and {module.weight.dtype for module in packed} == {torch.bfloat16}
    with torch.no_grad():
        for (batch, sequence), want in zip(BERT_SHAPES, unpacked):
            got = outputs(graph_module(**bert_inputs(batch, sequence)))
            for name in want:  # another GEMM kernel: the same bfloat16 products, rounded in another order
                torch.testing.assert_close(got[name], want[name], atol=2e-2, rtol=2e-2)
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert all(module._packed is not None for module in packed), "every layer took oneDNN's bfloat16 path"


def test_the_shipped_bfloat16_recipe_needs_its_accuracy_gate(tmp_path):
    from aot.recipe.load import load_recipe

    recipe = RECIPES / "bert_bf16.yaml"
    loaded = load_recipe(recipe)
    assert [spec.name for spec in loaded.passes][-1] == "cast_precision" and loaded.recipe.validate_.accuracy is not None
    assert not loaded.recipe.export.onnx.enabled, "ONNX Runtime's CPU provider has no bfloat16 kernels"
    text = recipe.read_text()
    ungated = tmp_path / "bert_bf16.yaml"
    ungated.write_text(text[: text.index("  accuracy:")] + text[text.index("export:") :])
    with pytest.raises(RecipeError, match=r"passes\[3\]: pass 'cast_precision' changes the computation"):
        load_recipe(ungated)
