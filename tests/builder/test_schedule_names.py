"""The schedule names stages by string (what it defers beside the export, what it frees after): each name it uses must
be a stage the spine runs, so renaming a stage fails here instead of silently changing how a build is scheduled."""

from __future__ import annotations

import ast
import inspect
import re

from aot.builder import schedule, spine
from aot.export.kinds import artifact_kinds


def _spine_stages() -> set[str]:
    """Every stage name ``_build`` runs: its literal names, and those it makes for each artifact kind."""
    source = inspect.getsource(spine._build)
    names = set(re.findall(r'(?:run|run_hashing_beside)\(\s*"([a-z_]+)"', source))
    for template in re.findall(r'f"([a-z_]+)\{kind\.name\}"', source):
        names |= {template + kind.name for kind in artifact_kinds()}
    return names


def _stage_names_the_schedule_compares() -> set[str]:
    """String constants the schedule compares a stage against (``stage == "x"``, ``stage in NAMES``)."""
    tree = ast.parse(inspect.getsource(schedule))
    names = set(schedule.DEFERRED_BESIDE_EXPORT)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "stage":
            names |= {c.value for c in node.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def test_every_stage_the_schedule_names_is_one_the_spine_runs():
    stages, named = _spine_stages(), _stage_names_the_schedule_compares()
    assert {"load_model", "eager_outputs", "validate_graph", "export_graph_module", "validate_onnx"} <= stages, stages
    assert len(named) >= 2, named  # precondition: the schedule's names were found
    assert named <= stages, f"the schedule names stages the spine does not run: {sorted(named - stages)}"
