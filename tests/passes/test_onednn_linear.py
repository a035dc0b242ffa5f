"""OneDNNLinear (aot.runtime): numerics against F.linear, the fallback paths, a pack that is never stale, plain state."""

from __future__ import annotations

import ast
import copy
import io
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import aot.runtime.onednn_linear as onednn_linear
from aot.runtime import OneDNNLinear

ACTIVATIONS = {
    "none": lambda y: y,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}
SHAPES = [(12,), (3, 12), (2, 5, 12)]

requires_onednn = pytest.mark.skipif(not onednn_linear._onednn_available(), reason="oneDNN is not available in this torch build")


def _layer(activation: str = "none", bias: bool = True) -> OneDNNLinear:
    torch.manual_seed(0)
    return OneDNNLinear(12, 7, bias=bias, activation=activation)


def _expected(layer: OneDNNLinear, x: torch.Tensor) -> torch.Tensor:
    return ACTIVATIONS[layer.activation](F.linear(x, layer.weight, layer.bias))


@requires_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_matches_linear_and_activation_on_the_onednn_path(activation, bias):
    layer = _layer(activation, bias)
    with torch.no_grad():
        for shape in SHAPES:
            x = torch.randn(*shape)
            torch.testing.assert_close(layer(x), _expected(layer, x), atol=1e-5, rtol=1e-5)
    assert layer._packed is not None, "the oneDNN path was not taken"


@requires_onednn
@pytest.mark.skipif(not onednn_linear._onednn_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no bfloat16 oneDNN")
def test_bfloat16():
    layer = _layer("gelu").to(torch.bfloat16)
    x = torch.randn(4, 12, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).float(), _expected(layer, x).float(), atol=2e-2, rtol=2e-2)
    assert layer._packed is not None


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_bfloat16_without_onednn_kernels_runs_float32s_gemm_on_the_same_values(monkeypatch, activation, bias):
    monkeypatch.setattr(onednn_linear, "_onednn_bfloat16_kernels", lambda: False)  # as on a CPU with AVX2 alone
    torch.manual_seed(0)
    layer = OneDNNLinear(300, 40, bias=bias, activation=activation).to(torch.bfloat16)
    gemms = []
    linear = F.linear
    monkeypatch.setattr(onednn_linear.F, "linear", lambda x, w, b=None: gemms.append((x.dtype, w.dtype)) or linear(x, w, b))
    for shape in [(300,), (3, 300), (2, 5, 300)]:
        x = torch.randn(*shape, dtype=torch.bfloat16)
        with torch.no_grad():
            got = layer(x)
            # the same sums in float32, rounded once to bfloat16, then the activation in bfloat16
            exact_sums = linear(x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double())
            want = ACTIVATIONS[activation](exact_sums.to(torch.bfloat16))
        assert got.dtype == torch.bfloat16 and got.shape == (*shape[:-1], 40)
        assert gemms[-1] == (torch.float32, torch.float32), "the layer ran float32's GEMM"
        # float32 sums of exact products differ from the exact sum by float32 rounding alone: at most one bfloat16 step
        steps = (got.float() - want.float()).abs() / want.float().abs().clamp(min=1e-3) * 2**7
        assert steps.max() <= 1.01, steps.max()
        assert (got == want).float().mean() > 0.95
    with torch.enable_grad():
        assert layer(torch.randn(2, 300, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert gemms[-1] == (torch.bfloat16, torch.bfloat16), "with gradients wanted, F.linear in bfloat16 as before"
    assert layer._packed is None, "nothing was packed: the weight stays bfloat16"


def test_the_constructor_takes_plain_literals_and_state_dict_holds_plain_tensors():
    layer = OneDNNLinear(768, 3072, bias=True, activation="gelu", batch_size_hint=128)
    layer(torch.randn(2, 768))  # packs, when oneDNN is there

    state = layer.state_dict()
    assert list(state) == ["weight", "bias"]
    assert all(tensor.layout == torch.strided and not tensor.is_mkldnn for tensor in state.values())
    assert state["weight"].shape == (3072, 768)
    assert "activation='gelu'" in repr(layer) and "batch_size_hint=128" in repr(layer)
    bound = 1 / math.sqrt(768)
    assert layer.weight.abs().max() <= bound + 1e-6, "initialised like nn.Linear"
    with pytest.raises(ValueError, match="activation must be one of"):
        OneDNNLinear(4, 4, activation="swish")
    with pytest.raises(ValueError, match="batch_size_hint"):
        OneDNNLinear(4, 4, batch_size_hint=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_fall_back_to_f_linear_exactly(dtype):
    layer = _layer("gelu").to(dtype)
    x = torch.randn(3, 12, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(layer(x), _expected(layer, x))
    assert layer._packed is None


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_onednn_unavailable_or_disabled_falls_back_exactly(monkeypatch):
    layer = _layer("relu")
    x = torch.randn(3, 12)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        assert torch.equal(layer(x), _expected(layer, x))
    monkeypatch.setattr(onednn_linear, "_onednn_available", lambda: False)
    with torch.no_grad():
        assert torch.equal(layer(x), _expected(layer, x))
    assert layer._packed is None


def test_gradients_flow_through_the_fallback():
    layer = _layer("gelu")
    x = torch.randn(3, 12, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    assert layer._packed is None


@requires_onednn
def test_the_pack_follows_in_place_edits_replacement_and_load_state_dict():
    layer = _layer("gelu")
    x = torch.randn(4, 12)
    with torch.no_grad():
        layer(x)
        first = layer._packed[3]
        layer(x)
        assert layer._packed[3] is first, "an unchanged weight is not packed again"

        layer.weight.mul_(2)  # in place: the version counter moves
        torch.testing.assert_close(layer(x), _expected(layer, x), atol=1e-5, rtol=1e-5)

        layer.weight = torch.nn.Parameter(torch.randn(7, 12))  # a new tensor
        torch.testing.assert_close(layer(x), _expected(layer, x), atol=1e-5, rtol=1e-5)

        layer.weight.data = torch.randn(7, 12)  # new storage under the same Parameter
        torch.testing.assert_close(layer(x), _expected(layer, x), atol=1e-5, rtol=1e-5)

        other = _layer("gelu")
        other.weight.data.normal_()
        layer.load_state_dict(other.state_dict())
        assert layer._packed is not None, "packed at load time"
        torch.testing.assert_close(layer(x), _expected(other, x), atol=1e-5, rtol=1e-5)


@requires_onednn
def test_copies_pickles_and_moves_drop_the_pack():
    layer = _layer("gelu")
    x = torch.randn(4, 12)
    with torch.no_grad():
        want = layer(x)
        clone = copy.deepcopy(layer)
        buffer = io.BytesIO()
        torch.save(layer, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert clone._packed is None and loaded._packed is None
        torch.testing.assert_close(clone(x), want, atol=0, rtol=0)
        torch.testing.assert_close(loaded(x), want, atol=0, rtol=0)
        layer.to(torch.float64)
        assert layer._packed is None
        assert torch.equal(layer(x.double()), _expected(layer, x.double()))


def test_export_sees_aten_linear_and_the_activation():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = _layer("gelu")

        def forward(self, x):
            return self.layer(x)

    program = torch.export.export(Model().eval(), (torch.randn(2, 12),))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {"aten.linear.default", "aten.gelu.default"} <= targets
    assert not any("mkldnn" in target for target in targets)


def test_source_is_self_contained():
    """The artifact writer copies this file into a torch-only module.py: torch and the standard library only."""
    source = Path(onednn_linear.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported <= {"math", "weakref", "torch"}, imported  # no __future__: the source is pasted mid-file

    namespace: dict = {"__name__": "module_py"}
    exec(compile(source, "module.py", "exec"), namespace)
    layer = namespace["OneDNNLinear"](12, 7, bias=False, activation="gelu", batch_size_hint=4)
    x = torch.randn(3, 12)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.gelu(F.linear(x, layer.weight)), atol=1e-5, rtol=1e-5)


@requires_onednn
def test_a_move_that_leaves_the_weight_as_it_is_keeps_the_pack():
    layer = _layer("gelu")
    assert layer.pack_now()
    packed = layer._packed[3]
    layer.to("cpu").to(torch.float32).eval()
    assert layer._packed is not None and layer._packed[3] is packed
    x = torch.randn(4, 12)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _expected(layer, x))


def test_pack_now_says_whether_the_onednn_path_can_use_the_weight():
    layer = _layer("gelu").to(torch.float64)
    assert layer.pack_now() is False and layer._packed is None
