"""The export frontend's errors name the model's line; a recipe dim without bounds takes the defaults."""

from __future__ import annotations

import pytest
import torch

from aot.errors import TraceError
from aot.tracing import export_trace
from aot.tracing.source_location import raised_at
from tests.failing_models import data_dependent_branch


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_dim_without_bounds_takes_the_default_range():
    # aot.inputs.dim_ranges gives (None, None) for a dynamic dim the recipe gives no min or max.
    gm = export_trace(Scale(), {"x": torch.ones(2, 3)}, {"x": {0: "batch", 1: "width"}},
                      dim_ranges={"batch": (None, None), "width": (None, 8)})
    assert gm.meta["trace_report"]["dim_ranges"] == {"batch": [1, None], "width": [2, 8]}


def test_export_failure_names_the_model_line():
    with pytest.raises(TraceError) as raised:
        export_trace(data_dependent_branch(), {"x": torch.ones(2, 4)}, {"x": {0: "batch"}})
    message = str(raised.value)
    assert "torch.export failed on DataDependentBranch at " in message
    assert "failing_models.py:" in message and "`if x.sum() > 0:`" in message
    assert "GuardOnDataDependentSymNode: Could not guard on data-dependent expression" in message


def test_raised_at_skips_torch_frames():
    def model_line():
        torch.nn.Linear(2, 2)(torch.ones(3))  # raises in torch.nn's Python code

    try:
        model_line()
    except RuntimeError as error:
        location = raised_at(error)
    assert location is not None and location.file == __file__
    assert location.expression == "torch.nn.Linear(2, 2)(torch.ones(3))  # raises in torch.nn's Python code"
