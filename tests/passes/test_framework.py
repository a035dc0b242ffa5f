"""The transformation API: the reference semantics, truthful results, marks in node.meta, errors."""

from __future__ import annotations

import json
import operator
import pickle

import pytest
import torch
from torch import nn

from aot.errors import PassError
from aot.passes import ChangeTrueDivToMulByInverse, MergeLinears, PassResult, ReversibleTransformation, Transformation
from aot.passes.base import REVERSE_KEY, TRANSFORMS_KEY
from tests.passes.helpers import LinearPair, assert_matches_eager, fx_graph, randn_sets


class ChangeMulToAdd(Transformation):
    """The reference documentation's example: no counting, so ``modified`` must be found out."""

    def transform(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == operator.mul:
                node.target = operator.add
        return graph_module


class MulToMulTimesTwo(ReversibleTransformation):
    def transform(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == operator.mul and not self.transformed(node):
                x, y = node.args
                node.args = (x, y * 2)
                self.mark_as_transformed(node)
        return graph_module

    def reverse(self, graph_module):
        for node in self.get_transformed_nodes(graph_module):
            x, y = node.args
            node.args = (x, y / 2)
            self.mark_as_restored(node)
        return graph_module


class Scale(nn.Module):
    def forward(self, x):
        return x * 3.0


def test_reference_example_is_callable_and_reports_modification_truthfully():
    graph_module = fx_graph(Scale(), torch.randn(2))
    assert ChangeMulToAdd.name == "change_mul_to_add"

    result = ChangeMulToAdd().apply(graph_module)

    assert isinstance(result, PassResult) and result.modified
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 4.0))
    again = ChangeMulToAdd().apply(graph_module)
    assert not again.modified, "nothing left to change, and the result says so"
    assert ChangeMulToAdd()(graph_module) is graph_module


def test_reversible_call_and_marks_are_json_in_node_meta():
    graph_module = fx_graph(Scale(), torch.randn(2))
    transformation = MulToMulTimesTwo()

    transformation(graph_module)

    [node] = transformation.get_transformed_nodes(graph_module)
    assert node.meta[TRANSFORMS_KEY] == ["mul_to_mul_times_two"]
    assert not hasattr(node, "transformations") and not hasattr(node, "was_transformed")
    json.dumps({k: v for k, v in node.meta.items() if k.startswith("aot_")})
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 6.0))
    transformation(graph_module, reverse=True)
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 3.0))
    assert TRANSFORMS_KEY not in node.meta
    with pytest.raises(ValueError, match="was not transformed"):
        transformation.mark_as_restored(node)


def test_marks_survive_save_and_reload_so_reverse_still_works():
    """Optimum kept marks as node attributes: lost on save/load, after which reverse silently did nothing."""
    torch.manual_seed(0)
    model = LinearPair().eval()
    graph_module = fx_graph(model, torch.randn(2, 4))
    MergeLinears()(graph_module)
    ChangeTrueDivToMulByInverse()(graph_module)
    saved_meta = json.dumps(
        [{k: v for k, v in node.meta.items() if k in (TRANSFORMS_KEY, REVERSE_KEY)} for node in graph_module.graph.nodes]
    )

    # GraphModule pickling keeps code and weights but re-traces the graph: node.meta is lost, names may change.
    reloaded = pickle.loads(pickle.dumps(graph_module))
    assert not any(TRANSFORMS_KEY in node.meta for node in reloaded.graph.nodes)
    assert [n.op for n in reloaded.graph.nodes] == [n.op for n in graph_module.graph.nodes]
    for node, meta in zip(reloaded.graph.nodes, json.loads(saved_meta)):
        node.meta.update(meta)

    result = MergeLinears().apply(reloaded, reverse=True)

    assert result.modified
    assert isinstance(reloaded.get_submodule("a"), nn.Linear) and reloaded.b.bias is None
    assert not any("merged" in name for name, _ in reloaded.named_modules())
    assert_matches_eager(model, reloaded, randn_sets((2, 4), (3, 4), (5, 1, 4)))


class ScaleMulBy(ReversibleTransformation):
    """Multiplies the constant of each multiplication by ``factor``: one class, several instances."""

    class Options(Transformation.Options):
        factor: float = 2.0

    def transform(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == operator.mul and not self.transformed(node):
                node.args = (node.args[0], node.args[1] * self.options.factor)
                self.mark_as_transformed(node)
                self.save_reverse_info(node, {"factor": self.options.factor})
        return graph_module

    def reverse(self, graph_module):
        for node in self.get_transformed_nodes(graph_module):
            node.args = (node.args[0], node.args[1] / self.reverse_info(node)["factor"])
            self.mark_as_restored(node)
        return graph_module


def test_marks_belong_to_the_transformation_with_its_options():
    """As Optimum's per-instance signature: a pass with other options does not take another's marks."""
    assert ScaleMulBy().signature == "scale_mul_by" == ScaleMulBy(factor=2.0).signature
    assert ScaleMulBy(factor=5.0).signature == 'scale_mul_by({"factor":5.0})'
    graph_module = fx_graph(Scale(), torch.randn(2))

    ScaleMulBy(factor=5.0)(graph_module)
    ScaleMulBy()(graph_module)  # another instance: not stopped by the first one's mark

    [node] = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    assert node.meta[TRANSFORMS_KEY] == ['scale_mul_by({"factor":5.0})', "scale_mul_by"]
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 30.0))
    assert ScaleMulBy(factor=5.0).transformed(node) and not ScaleMulBy(factor=3.0).transformed(node)

    ScaleMulBy(factor=5.0)(graph_module, reverse=True)  # an equal instance reverses its own marks only
    assert node.meta[TRANSFORMS_KEY] == ["scale_mul_by"]
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 6.0))
    ScaleMulBy()(graph_module, reverse=True)
    assert TRANSFORMS_KEY not in node.meta and REVERSE_KEY not in node.meta
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 3.0))


def test_a_failing_transform_raises_pass_error_naming_the_pass():
    class Broken(Transformation):
        def transform(self, graph_module):
            raise RuntimeError("boom")

    with pytest.raises(PassError, match="pass 'broken' failed: RuntimeError: boom"):
        Broken()(fx_graph(Scale(), torch.randn(2)))


def test_a_pass_leaving_an_invalid_graph_is_named():
    class Dangling(Transformation):
        def transform(self, graph_module):
            for node in graph_module.graph.nodes:
                if node.op == "call_function":
                    node.args = (torch.fx.Node(graph_module.graph, "ghost", "placeholder", "ghost", (), {}), 1.0)
            return graph_module

    with pytest.raises(PassError, match="pass 'dangling' failed: it left an invalid graph"):
        Dangling()(fx_graph(Scale(), torch.randn(2)))


def test_returning_something_else_than_a_graph_module_is_an_error():
    class ReturnsNone(Transformation):
        def transform(self, graph_module):
            return None

    with pytest.raises(PassError, match="returned NoneType"):
        ReturnsNone()(fx_graph(Scale(), torch.randn(2)))


def test_lint_and_recompile_false_defers_recompilation():
    graph_module = fx_graph(Scale(), torch.randn(2))
    code = graph_module.code

    ChangeMulToAdd()(graph_module, lint_and_recompile=False)

    assert graph_module.code == code
    graph_module.recompile()
    assert "x + 3.0" in graph_module.code


def test_unknown_option_is_rejected():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="extra"):
        MergeLinears(min_group=3)
    assert repr(MergeLinears(min_group_size=3)) == "MergeLinears(min_group_size=3, across_scopes=False)"


def test_reversing_with_other_options_than_the_transformation_is_an_error_not_a_no_op():
    graph_module = fx_graph(Scale(), torch.randn(2))
    ScaleMulBy(factor=5.0)(graph_module)
    with pytest.raises(PassError, match=r"""no node carries the marks of scale_mul_by, but some carry those of scale_mul_by\({"factor":5.0}\)"""):
        ScaleMulBy()(graph_module, reverse=True)
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 15.0)), "nothing was reversed"


class MulByTwoWithoutSuperInit(ReversibleTransformation):
    """Optimum's transformations may keep state of their own and never call ``super().__init__()``."""

    def __init__(self, factor: float = 2.0):
        self.factor = factor

    def transform(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == operator.mul and not self.transformed(node):
                node.args = (node.args[0], node.args[1] * self.factor)
                self.mark_as_transformed(node)
        return graph_module

    def reverse(self, graph_module):
        for node in self.get_transformed_nodes(graph_module):
            node.args = (node.args[0], node.args[1] / self.factor)
            self.mark_as_restored(node)
        return graph_module


def test_a_transformation_whose_init_skips_super_init_signs_marks_and_reverses():
    transformation = MulByTwoWithoutSuperInit()
    assert "options" not in vars(transformation), "the precondition: no super().__init__() ran"
    graph_module = fx_graph(Scale(), torch.randn(2))
    assert transformation.signature == 'mul_by_two_without_super_init({"factor":2.0})', "its attributes sign it, as in Optimum"

    result = transformation.apply(graph_module)
    assert result.modified
    assert torch.equal(graph_module(torch.ones(2)), torch.full((2,), 6.0))
    marked = transformation.get_transformed_nodes(graph_module)
    assert [node.meta[TRANSFORMS_KEY] for node in marked] == [['mul_by_two_without_super_init({"factor":2.0})']]
    assert not MulByTwoWithoutSuperInit(factor=3.0).get_transformed_nodes(graph_module), "other attributes, other marks"

    restored = transformation(graph_module, reverse=True)
    assert torch.equal(restored(torch.ones(2)), torch.full((2,), 3.0))
    assert not transformation.get_transformed_nodes(restored) and repr(transformation) == "MulByTwoWithoutSuperInit()"


def test_a_transformation_without_super_init_whose_options_need_values_says_so():
    from pydantic import BaseModel

    class NeedsAFactor(Transformation):
        class Options(BaseModel):
            factor: float

        def __init__(self):
            pass

        def transform(self, graph_module):
            return graph_module

    with pytest.raises(PassError, match=r"pass 'needs_a_factor' failed: its __init__ did not call super\(\).__init__\(\), and its options factor have no default"):
        NeedsAFactor().signature


def test_the_signature_reads_the_attributes_the_transformation_was_made_with_not_its_running_state():
    class KeepsState(ReversibleTransformation):
        def __init__(self, scale=1.0):
            self._scale, self.names = scale, ["a", "b"]

        def transform(self, graph_module):
            self.seen = {node.name: node for node in graph_module.graph.nodes}  # state of the run: not signed
            for node in graph_module.graph.nodes:
                if node.op == "call_function":
                    self.mark_as_transformed(node)
            return graph_module

        def reverse(self, graph_module):
            for node in self.get_transformed_nodes(graph_module):
                self.mark_as_restored(node)
            return graph_module

    signature = 'keeps_state({"_scale":1.0,"names":["a","b"]})'
    graph_module = fx_graph(Scale(), torch.randn(2))
    KeepsState()(graph_module)
    assert [node.meta[TRANSFORMS_KEY] for node in KeepsState().get_transformed_nodes(graph_module)] == [[signature]]
    KeepsState()(graph_module, reverse=True)  # a fresh instance, signed before any run
    assert not any(TRANSFORMS_KEY in node.meta for node in graph_module.graph.nodes)
    assert KeepsState(scale=2.0).signature != signature


def test_an_attribute_without_stable_text_is_an_error_naming_it():
    class HoldsAModule(Transformation):
        def __init__(self):
            self.layer = nn.Linear(2, 2)

        def transform(self, graph_module):
            return graph_module

    with pytest.raises(PassError, match=r"pass 'holds_a_module' failed: its attribute layer holds a Linear, which has no text"):
        HoldsAModule().signature


def test_every_built_in_pass_with_its_default_options_is_signed_by_its_name_alone():
    """Signatures land in saved graphs (node.meta): attributes signing did not change any built-in pass's."""
    from aot.passes import registry

    for info in registry.all_passes():
        assert info.create().signature == info.name, info.name


class Tagged(Transformation):
    """Optimum's style, at module level so that another process can import it."""

    def __init__(self, tag=None):
        self.tag = tag

    def transform(self, graph_module):
        return graph_module


def test_the_signature_is_the_same_text_in_another_process():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import torch; from tests.passes.test_framework import Tagged; from aot.passes import MergeLinears; "
            "print(Tagged(tag={'b': (1, 2.5), 'a': torch.float16, 'c': {3, 1, 2}}).signature); "
            "print(MergeLinears(min_group_size=3).signature)")
    here = [Tagged(tag={"b": (1, 2.5), "a": torch.float16, "c": {3, 1, 2}}).signature, MergeLinears(min_group_size=3).signature]
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert there == here == ['tagged({"tag":{"a":"torch.float16","b":[1,2.5],"c":[1,2,3]}})', 'merge_linears({"min_group_size":3})']
