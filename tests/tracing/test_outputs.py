"""graph_output_names: the names of a graph's outputs read from its nodes, as running it names them."""

from __future__ import annotations

import pytest
import torch

from aot.tracing import export_trace, symbolic_trace
from aot.tracing.outputs import flatten_outputs, graph_output_names
from tests.tracing.tracing_zoo import ZOO


@pytest.mark.artifact
@pytest.mark.parametrize("name", sorted(ZOO))
def test_names_read_from_the_nodes_are_those_of_a_run(name):
    model, input_names, shapes = ZOO[name]("eager")
    inputs = shapes[0]()
    graph_module = symbolic_trace(model, input_names=input_names, dummy_inputs=inputs)
    with torch.no_grad():
        ran = list(flatten_outputs(graph_module(**inputs)))
    assert ran  # a graph with outputs to name
    assert graph_output_names(graph_module) == ran


def test_a_tuple_of_tensors_and_a_none_are_named_as_a_run_names_them():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x + 1, None, (x * 2,)

    graph_module = symbolic_trace(Pair(), input_names=["x"], dummy_inputs={"x": torch.ones(2, 3)}, disable_check=True)
    assert graph_output_names(graph_module) == list(flatten_outputs(graph_module(torch.ones(2, 3)))) == ["output_0", "output_2.0"]


def test_an_output_node_without_an_example_value_gives_no_names():
    model, input_names, shapes = ZOO["bert"]("eager")
    inputs = shapes[0]()
    graph_module = symbolic_trace(model, input_names=input_names, dummy_inputs=inputs)
    assert graph_output_names(graph_module) is not None
    graph_module.graph.output_node().all_input_nodes[0].meta.pop("val")  # as a pass that made a new node leaves it
    assert graph_output_names(graph_module) is None


def test_a_graph_whose_code_rebuilds_its_outputs_gives_no_names():
    model, input_names, shapes = ZOO["bert"]("eager")
    graph_module = export_trace(model, shapes[0]())
    assert type(graph_module.graph._codegen) is not torch.fx.graph.CodeGen  # torch.export's pytree code generation
    assert graph_output_names(graph_module) is None
