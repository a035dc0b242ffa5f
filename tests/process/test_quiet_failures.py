"""A failed trace or export is one line on stderr; torch's own report of it shows only with --debug.

Each build runs ``aot`` in a child process, as a user would: torch's loggers write to the
process's real stderr through handlers of their own, which an in-process runner cannot
capture, and the ONNX export runs in a forked grandchild.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import pytest

from aot.process.quiet import quiet_torch
from tests.log_messages import messages_of

REPOSITORY = Path(__file__).resolve().parents[2]

INPUTS = """\
inputs:
  dims:
    batch: {size: 2, dynamic: true}
  tensors:
    - {name: x, shape: [batch, 4], dtype: float32}
"""

# What torch prints to stderr when torch.export fails: the graph captured so far, as Python source.
PARTIAL_GRAPH = "def forward(self"


class Failure(NamedTuple):
    recipe: str  # the model and trace sections; INPUTS is added
    exit_code: int
    fault: str  # what aot's one line names
    debug_shows: str | None  # a line of torch's own report, which --debug must show


FAILURES = {
    "export-frontend": Failure(
        "model: {factory: 'tests.failing_models:data_dependent_branch'}\ntrace: {frontend: export}\n",
        3,
        "torch.export failed on DataDependentBranch at ",
        PARTIAL_GRAPH,
    ),
    "fx-frontend": Failure(
        "model: {factory: 'tests.failing_models:mismatched_matmul'}\n",
        3,
        "operation that cannot be traced at ",
        "failed while attempting to run meta for aten.mm.default",
    ),
    "onnx-untranslatable-op": Failure(
        "model: {factory: 'tests.failing_models:running_maximum'}\n",
        6,
        "No ONNX function found for <OpOverload(op='aten.cummax'",
        None,  # torch reports this one in its exception alone (quiet already before aot.process.quiet)
    ),
    "onnx-torch-export": Failure(
        "model: {factory: 'tests.failing_models:gated_linear'}\n"
        "trace: {leaf_modules: [tests.failing_models.SignGate]}\n"
        "export: {graph_module: false}\n",  # the saved GraphModule cannot hold the test's leaf class
        6,
        "torch.onnx.export rejects the graph for model.onnx: GuardOnDataDependentSymNode at ",
        PARTIAL_GRAPH,
    ),
}


def _build(tmp_path: Path, recipe_text: str, *options: str) -> subprocess.CompletedProcess:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text + INPUTS)
    # `tests.failing_models` must import in the child: the repository goes on its path.
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", *options,
               "build", str(recipe), "-o", str(tmp_path / "out")]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=300)


def _described(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@pytest.mark.artifact
@pytest.mark.parametrize("name", list(FAILURES))
def test_failure_is_one_line_on_stderr(tmp_path, name):
    failure = FAILURES[name]
    result = _build(tmp_path, failure.recipe)
    assert result.returncode == failure.exit_code, _described(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, _described(result)
    assert lines[0].startswith("aot: error: ") and failure.fault in lines[0], _described(result)
    assert not result.stdout, _described(result)


@pytest.mark.artifact
@pytest.mark.parametrize("name", [name for name, failure in FAILURES.items() if failure.debug_shows])
def test_debug_shows_what_torch_reported(tmp_path, name):
    failure = FAILURES[name]
    result = _build(tmp_path, failure.recipe, "--debug")
    assert result.returncode == failure.exit_code, _described(result)
    assert failure.debug_shows in result.stderr, _described(result)
    assert "Traceback (most recent call last)" in result.stderr, _described(result)
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith("aot: error: ") and failure.fault in last_line, _described(result)


# The context manager itself, in process.


@pytest.fixture
def aot_level():
    """Set the ``aot`` logger's level as ``aot --debug`` (DEBUG) or a plain run (WARNING) would."""
    aot_logger = logging.getLogger("aot")
    level_before = aot_logger.level
    yield aot_logger.setLevel
    aot_logger.setLevel(level_before)


@pytest.fixture
def quiet_records():
    """The messages aot.process.quiet logs (pytest's logging plugin is off in this project)."""
    with messages_of("aot.process.quiet", level=None) as messages:
        yield messages


def test_quiet_torch_holds_torch_loggers_and_restores_them(aot_level):
    aot_level(logging.WARNING)
    torch_logger, child = logging.getLogger("torch"), logging.getLogger("torch.quiet_failures_test")
    child.setLevel(logging.INFO)  # a level of its own: it would not inherit the hold
    levels_before = (torch_logger.level, child.level)
    try:
        with quiet_torch("test"):
            assert not torch_logger.isEnabledFor(logging.CRITICAL)
            assert not child.isEnabledFor(logging.CRITICAL)
            assert not logging.getLogger("torch.made_inside_the_block").isEnabledFor(logging.CRITICAL)
        assert (torch_logger.level, child.level) == levels_before
    finally:
        child.setLevel(logging.NOTSET)


def test_quiet_torch_restores_loggers_when_the_block_raises(aot_level):
    aot_level(logging.WARNING)
    level_before = logging.getLogger("torch").level
    with pytest.raises(RuntimeError, match="export failed"), quiet_torch("test"):
        raise RuntimeError("export failed")
    assert logging.getLogger("torch").level == level_before


def test_quiet_torch_ignores_warnings_unless_debugging(aot_level):
    aot_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_torch("test"):
            warnings.warn("from the exporter", UserWarning)
    assert not seen
    aot_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_torch("test"):
            warnings.warn("from the exporter", UserWarning)
    assert [str(warning.message) for warning in seen] == ["from the exporter"]


def test_quiet_torch_leaves_loggers_alone_when_debugging(aot_level):
    aot_level(logging.DEBUG)
    with quiet_torch("test"):
        assert logging.getLogger("torch").isEnabledFor(logging.WARNING)


def test_quiet_torch_logs_what_the_block_printed_at_debug(aot_level, quiet_records, capsys):
    aot_level(logging.DEBUG)
    with pytest.raises(ValueError), quiet_torch("the exporter"):
        print("partial graph", file=sys.stderr)
        print("progress")
        raise ValueError("failed")
    assert capsys.readouterr() == ("", "")
    assert quiet_records == ["the exporter printed:\npartial graph\nprogress"]
