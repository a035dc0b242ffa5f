"""The ONNX unit's lowering passes: registered by name in order, each saying truthfully what it did, recorded."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest
import torch
import torch.fx

from aot.builder.onnx_stage import OnnxStage
from aot.errors import ExportError
from aot.export import onnx_lowering
from aot.export.onnx_lowering import ONNX_LOWERING, LoweringContext, OnnxLoweringPass, _registry, run_lowering
from aot.inputs import ShapeCase
from aot.passes import QuantizeLinearInt8, QuantizeLinearWeights
from aot.recipe.schema import OnnxSpec
from aot.runtime import Int8DynamicLinear

EXPECTED = ["with_explicit_copies", "lower_int8_linears", "lower_weight_only_linears",
            "shift_int8_codes_on_write", "declare_contrib_domain", "rename_inputs"]


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


class ReshapedCopy(torch.nn.Module):
    def forward(self, x):
        return x.transpose(1, 2).contiguous().reshape(x.shape[0], -1)


def _records(records) -> dict[str, tuple[bool, int]]:
    return {record.name: (record.modified, record.changed) for record in records}


def test_the_lowering_passes_are_registered_in_the_order_they_run():
    assert list(ONNX_LOWERING) == EXPECTED
    assert [lowering.form for lowering in ONNX_LOWERING.values()] == ["fx"] * 3 + ["onnx"] * 3
    assert all(lowering.summary for lowering in ONNX_LOWERING.values()), "each says what it does"
    first = ONNX_LOWERING["rename_inputs"]
    with pytest.raises(ValueError, match="two ONNX lowering passes are registered as 'rename_inputs'"):
        _registry(first, first)
    with pytest.raises(ValueError, match="snake_case"):
        _registry(OnnxLoweringPass("RenameInputs", "onnx", first.lower))


def test_a_graph_with_nothing_to_lower_is_handed_on_as_it_was():
    graph_module = torch.fx.symbolic_trace(TwoLinears())
    lowered, records = run_lowering("fx", graph_module, context := LoweringContext())
    assert [record.name for record in records] == EXPECTED[:3]
    assert lowered is graph_module and not context.translations
    assert _records(records) == dict.fromkeys(EXPECTED[:3], (False, 0))


@pytest.mark.parametrize("case", ["copies", "int8", "weight_only"])
def test_each_graph_pass_lowers_a_copy_and_counts_what_it_lowered(case):
    if case == "copies":
        graph_module, expected = torch.fx.symbolic_trace(ReshapedCopy()), "with_explicit_copies"
    else:
        graph_module = torch.fx.symbolic_trace(TwoLinears())
        if case == "int8":
            QuantizeLinearInt8()(graph_module)
            expected = "lower_int8_linears"
            assert sum(isinstance(module, Int8DynamicLinear) for module in graph_module.modules()) == 2, "precondition"
        else:
            QuantizeLinearWeights(bits=4, group_size=32)(graph_module)
            expected = "lower_weight_only_linears"
    code = graph_module.code

    lowered, records = run_lowering("fx", graph_module, context := LoweringContext())

    assert graph_module.code == code, "the graph handed in is left as it was"
    assert lowered is not graph_module
    want = dict.fromkeys(EXPECTED[:3], (False, 0)) | {expected: (True, 1 if case == "copies" else 2)}
    assert _records(records) == want
    assert bool(context.translations) == (case != "copies"), "the exporter gets a translation of each op put in"


def _model(input_names: list[str], branch_domain: str | None = None) -> ir.Model:
    """A model adding its inputs; with ``branch_domain``, an If whose branches hold a node of that domain."""
    inputs = [ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2])) for name in input_names]
    nodes = [ir.node("Add", inputs)]
    if branch_domain is not None:
        branches = {}
        for name in ("then_branch", "else_branch"):
            gelu = ir.node("Gelu", [inputs[0]], domain=branch_domain)
            branches[name] = ir.Graph([], gelu.outputs, nodes=[gelu], name=name)
        condition = ir.node("Constant", [], attributes={"value_int": 1})
        nodes += [condition, ir.node("If", [condition.outputs[0]], attributes=branches)]
    graph = ir.Graph(inputs, [nodes[0].outputs[0]], nodes=nodes, opset_imports={"": 18})
    return ir.Model(graph, ir_version=8)


def test_rename_inputs_renames_only_what_it_is_given_and_says_so():
    model = _model(["past_key_values_0_key", "x"])
    _, records = run_lowering("onnx", model, LoweringContext(input_names={"past_key_values_0_key": "past_key_values.0.key"}))
    assert [value.name for value in model.graph.inputs] == ["past_key_values.0.key", "x"]
    assert _records(records)["rename_inputs"] == (True, 1)
    _, again = run_lowering("onnx", model, LoweringContext())
    assert _records(again) == dict.fromkeys(EXPECTED[3:], (False, 0))


def test_the_contrib_domain_is_declared_where_only_an_if_branch_uses_it():
    model = _model(["x", "y"], branch_domain="com.microsoft")
    assert "com.microsoft" not in model.opset_imports, "precondition: the domain is undeclared"
    _, records = run_lowering("onnx", model, LoweringContext())
    assert model.opset_imports["com.microsoft"] == 1 and _records(records)["declare_contrib_domain"] == (True, 1)
    _, again = run_lowering("onnx", model, LoweringContext())
    assert _records(again)["declare_contrib_domain"] == (False, 0), "declared once"


def test_modified_is_computed_not_taken_from_the_count(monkeypatch):
    def renames_without_counting(model, context):
        """Renames the first input, and counts nothing."""
        model.graph.inputs[0].name = "renamed"
        return model, 0

    monkeypatch.setattr(onnx_lowering, "ONNX_LOWERING", _registry(OnnxLoweringPass("quiet", "onnx", renames_without_counting)))
    _, records = run_lowering("onnx", _model(["x"]), LoweringContext())
    assert _records(records) == {"quiet": (True, 0)}


def test_a_pass_that_fails_is_named(monkeypatch):
    def fails(model, context):
        """Fails."""
        raise ValueError("no block divides 40 input features")

    monkeypatch.setattr(onnx_lowering, "ONNX_LOWERING", _registry(OnnxLoweringPass("fails", "onnx", fails)))
    with pytest.raises(ExportError, match="ONNX lowering pass 'fails' failed: ValueError: no block divides 40"):
        run_lowering("onnx", _model(["x"]), LoweringContext())


@pytest.mark.artifact
def test_the_export_stage_brings_back_what_each_pass_did(tmp_path):
    graph_module = torch.fx.symbolic_trace(TwoLinears())
    QuantizeLinearWeights(bits=8)(graph_module)
    case = ShapeCase(dims={}, inputs={"x": torch.randn(2, 64)})
    # the build's own call, in a forked child; the stand-in eager model is what the child moves to the meta device
    stage = OnnxStage.start(OnnxSpec(), graph_module, torch.nn.Module(), [case], tmp_path / "model.onnx", {"x": {0: "batch"}}, {})
    assert stage.lowering == [], "precondition: nothing is known before the export is done"
    stage.finish(tmp_path / "model.onnx", None)

    record = {entry["pass"]: entry for entry in stage.lowering}
    assert list(record) == EXPECTED
    assert record["lower_weight_only_linears"] == {"pass": "lower_weight_only_linears", "form": "fx", "modified": True, "changed": 2}
    assert record["shift_int8_codes_on_write"] == {"pass": "shift_int8_codes_on_write", "form": "onnx", "modified": True, "changed": 2}
    assert not any(record[name]["modified"] for name in ("with_explicit_copies", "lower_int8_linears", "rename_inputs"))


@pytest.mark.artifact
def test_the_manifest_records_the_onnx_lowering_of_a_build(tiny_build):
    manifest = json.loads((tiny_build / "manifest.json").read_text())
    assert (tiny_build / "model.onnx").is_file(), "precondition: the build wrote an ONNX model"

    lowering = manifest["onnx_lowering"]
    assert [entry["pass"] for entry in lowering] == EXPECTED
    assert [entry["form"] for entry in lowering] == [lowering_pass.form for lowering_pass in ONNX_LOWERING.values()]
    assert all(entry["modified"] == (entry["changed"] > 0) for entry in lowering), "each counts what it changed"
    unmodified = {entry["pass"] for entry in lowering if not entry["modified"]}
    assert {"lower_int8_linears", "lower_weight_only_linears", "shift_int8_codes_on_write"} <= unmodified, "a float32 BERT"
