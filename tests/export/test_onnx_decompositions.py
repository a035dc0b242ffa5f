"""Node-by-node decomposition for the ONNX exporter: the retrace's ops without the retrace, or the retrace."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from torch.onnx._internal.exporter import _decomp, _fx_passes, _registration

from aot.export import onnx_decompositions, onnx_export, run_onnx
from aot.export.onnx_decompositions import decompose_where_needed, only_needed_decompositions

from ..log_messages import messages_of
from . import models


@pytest.fixture(scope="module")
def table():
    registry = _registration.ONNXRegistry.from_torchlib()
    return _decomp.create_onnx_friendly_decomposition_table(set(_decomp.get_onnx_implemented_overloads(registry)))


def _pending(program, table) -> list[str]:
    preserved = onnx_decompositions._preserved_composites(table)
    return [str(node.target) for node in program.graph.nodes if onnx_decompositions._needs_decomposing(node, table, preserved)]


def _ops(program) -> Counter:
    return Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")


class Reductions(torch.nn.Module):
    """Ops the table decomposes (one into prims), a composite that may alias, a cast, and several outputs."""

    def forward(self, x):
        variance, mean = torch.var_mean(x, dim=-1)
        low, high = torch.aminmax(x, dim=-1)
        left, right = torch.chunk(x, 2, dim=-1)
        return variance + mean + low + high, left * right, x.flatten(1).to(torch.float64)


def _export(model, x):
    return torch.export.export(model, (), {"x": x}, dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})


@pytest.mark.artifact
def test_the_nodes_that_need_it_are_decomposed_as_the_whole_program_retrace_decomposes_them(table):
    x = torch.randn(3, 8)
    program = _export(Reductions(), x)
    before = _pending(program, table)
    assert {"aten.var_mean.dim", "aten.aminmax.default", "aten.chunk.default", "aten.to.dtype"} <= set(before)

    assert decompose_where_needed(program, table) is None

    assert _pending(program, table) == []
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        retraced = _export(Reductions(), x).run_decompositions(table)
    assert _ops(program) == _ops(retraced)
    for batch in (3, 1, 7):
        sample = torch.randn(batch, 8)
        for got, want in zip(program.module()(x=sample), Reductions()(sample), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


class LinearGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


@pytest.mark.artifact
def test_outputs_that_were_decomposed_keep_their_place_in_the_onnx_model(tmp_path):
    x = torch.randn(3, 8)
    program = _export(Reductions(), x)
    outputs = program.graph.output_node().args[0]
    assert outputs[2].target == torch.ops.aten.to.dtype  # an output the decomposition replaces
    path = tmp_path / "model.onnx"

    onnx_export.write_onnx(program.module(), path, {"x": x}, {"x": {0: "batch"}})

    for batch in (3, 1, 7):
        sample = torch.randn(batch, 8)
        got = list(run_onnx(path, {"x": sample}).values())
        for value, want in zip(got, Reductions()(sample), strict=True):
            np.testing.assert_allclose(value, want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_program_with_nothing_to_decompose_is_left_as_it_is(table):
    program = _export(LinearGelu(), torch.randn(3, 8))
    assert _ops(program)["aten.linear.default"] == 1
    code = program.graph_module.code

    assert decompose_where_needed(program, table) is None

    assert program.graph_module.code == code


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x.flatten(1) * self.calls


class Branches(torch.nn.Module):
    def forward(self, x):
        flat = x.flatten(1)
        return torch.cond(flat.sum() > 0, lambda t: t + 1, lambda t: t - 1, (flat,))


@pytest.mark.parametrize(
    "model, reason",
    [(CountsCalls(), "node 'add_' mutates (aten.add_.Tensor)"), (Branches(), "node 'cond' calls cond, which is no ATen op")],
    ids=["buffer_mutation", "higher_order_op"],
)
def test_a_program_that_is_not_functional_is_left_for_the_whole_program_retrace(table, model, reason):
    program = _export(model, torch.randn(3, 2, 2))
    assert "aten.flatten.using_ints" in _pending(program, table)
    code = program.graph_module.code

    assert decompose_where_needed(program, table) == reason

    assert program.graph_module.code == code


def test_a_node_that_cannot_be_traced_alone_leaves_the_program_to_the_retrace(table, monkeypatch):
    program = _export(Reductions(), torch.randn(3, 8))
    assert len(_pending(program, table)) >= 4
    code = program.graph_module.code
    traced = []

    def fails_on_the_third(node, table):
        traced.append(node.name)
        if len(traced) == 3:
            raise RuntimeError("no meta for this node\nsecond line")
        return trace_decomposed(node, table)

    trace_decomposed = onnx_decompositions._trace_decomposed
    monkeypatch.setattr(onnx_decompositions, "_trace_decomposed", fails_on_the_third)

    reason = decompose_where_needed(program, table)

    assert reason.startswith(f"node '{traced[2]}' (") and reason.endswith("cannot be traced alone: RuntimeError: no meta for this node")
    assert program.graph_module.code == code  # the two traced before it were not spliced in


def test_the_exporter_gets_its_own_function_back_even_after_an_error():
    original = _fx_passes.decompose_with_registry
    with only_needed_decompositions():
        assert _fx_passes.decompose_with_registry is not original
    assert _fx_passes.decompose_with_registry is original
    with pytest.raises(RuntimeError), only_needed_decompositions():
        raise RuntimeError("export failed")
    assert _fx_passes.decompose_with_registry is original


def _write(tmp_path, name, graph, inputs, dims):
    path = tmp_path / name / "model.onnx"
    path.parent.mkdir()
    onnx_export.write_onnx(graph, path, inputs, dims, ort_fusions="cpu")
    return path


def _count_retraces(monkeypatch) -> list[int]:
    calls = []
    retrace = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        calls.append(1)
        return retrace(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    return calls


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_bert_exports_without_a_retrace_to_the_graph_the_retrace_gives(tmp_path, monkeypatch, frontend):
    bert = models.tiny_bert()
    cases = [models.text_inputs(b, s) for b, s in models.TEXT_SHAPES]
    graph = (
        models.fx_graph(bert, ["input_ids", "attention_mask"])
        if frontend == "fx"
        else models.export_graph(bert, cases[0], models.TEXT_DIMS)
    )
    retraces = _count_retraces(monkeypatch)
    node_by_node = _write(tmp_path, "node_by_node", graph, cases[0], models.TEXT_DIMS)
    assert retraces == []
    monkeypatch.setattr(onnx_export, "only_needed_decompositions", contextlib.nullcontext)
    whole = _write(tmp_path, "whole", graph, cases[0], models.TEXT_DIMS)
    assert retraces == [1]

    op_types = [Counter(node.op_type for node in onnx.load(path).graph.node) for path in (node_by_node, whole)]
    assert op_types[0]["MultiHeadAttention"] == 2  # one per layer: the fusions find what they find after a retrace
    assert op_types[0] == op_types[1]
    for case in cases:
        got, want = run_onnx(node_by_node, case), run_onnx(whole, case)
        assert list(got) == list(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.artifact
def test_the_reason_for_a_whole_program_retrace_is_logged(tmp_path):
    path = tmp_path / "model.onnx"
    with messages_of(onnx_decompositions.__name__, logging.INFO) as messages:
        x = torch.randn(3, 2, 2)
        onnx_export.write_onnx(_export(CountsCalls(), x).module(), path, {"x": x}, None)
    assert messages == ["ONNX export: the whole program is decomposed (node 'add_' mutates (aten.add_.Tensor))"]
    assert path.exists()
