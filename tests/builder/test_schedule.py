"""The schedule decides from what each step declares it reads and writes, never from a stage's name.

It moves the steps that run a model and that the export does not wait on beside the export, frees each object after
the last step that reads it, and keeps a memory-first build in the spine's order.
"""

from __future__ import annotations

import ast
import functools
import inspect
import random
import re
from types import SimpleNamespace

import pytest

from aot.builder import schedule, spine, steps
from aot.builder.report import BuildReport
from aot.builder.schedule import BuildSchedule, decide
from aot.builder.steps import Data, declares
from aot.export.kinds import artifact_kinds

D = Data


def _names(found) -> list[str]:
    return [step.__name__ for step in found]


def _freed(decisions) -> dict[str, set[str]]:
    """``{step: names of what goes after it}``."""
    return {decisions.order[index].__name__: {data.name for data in items} for index, items in decisions.freed_after.items()}


def _spine_calls() -> set[str]:
    """The ``steps.<name>`` the spine's ``_build`` and the schedule's methods hand on to be run."""
    found = set()
    for code in (spine._build, schedule.BuildSchedule):
        tree = ast.parse(inspect.getsource(code).lstrip())
        found |= {node.attr for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "steps"}
    return found - {"Work"}


def test_every_step_the_spine_runs_declares_what_it_reads_and_writes():
    called = _spine_calls()
    assert {"load", "take_eager_reference", "check_graph", "start_onnx_export", "write_build_manifest"} <= called, called
    assert called == set(_names(spine.SPINE)), "SPINE lists every step the spine and the schedule run, and no other"
    for step in spine.SPINE:
        assert isinstance(step.reads, frozenset) and isinstance(step.writes, frozenset), step.__name__
        assert step.reads | step.writes, f"{step.__name__} declares nothing"
        assert all(isinstance(data, Data) for data in step.reads | step.writes), step.__name__


def test_a_declaration_names_data_not_strings():
    with pytest.raises(TypeError, match="as Data"):
        declares(reads={"graph"})


def test_the_reference_and_the_graphs_check_run_beside_the_export():
    decisions = decide(spine.SPINE, memory_first=False)
    assert decisions.deferred == {steps.take_eager_reference, steps.check_graph}
    start = decisions.order.index(steps.start_onnx_export)
    assert _names(decisions.order[start:start + 3]) == ["start_onnx_export", "take_eager_reference", "check_graph"]
    assert decisions.order.index(steps.write_deployment) < start, "the deployment files run no model: they stay"
    assert _freed(decisions) == {"take_eager_reference": {"MODEL_WEIGHTS", "MODEL_STRUCTURE"},
                                 "write_artifact": {"GRAPH", "KIND_GRAPHS"}}


def test_a_memory_first_build_runs_in_the_spines_order_and_frees_earlier():
    decisions = decide(spine.SPINE, memory_first=True)
    assert not decisions.deferred and decisions.order == spine.SPINE
    assert _freed(decisions) == {
        "take_eager_reference": {"MODEL_WEIGHTS"},  # to the meta device: the structure serves until the export starts
        "check_graph": {"GRAPH_DERIVED"},  # before the export forks
        "start_onnx_export": {"MODEL_STRUCTURE"},
        "write_artifact": {"GRAPH", "KIND_GRAPHS"},
    }


def _check_nothing_freed_is_read(decisions) -> int:
    """Walk the order as run; fail on a step reading what went before it. Returns how many reads were checked."""
    holds = {D.MODEL_STRUCTURE: D.MODEL_WEIGHTS, D.GRAPH: D.GRAPH_DERIVED}
    freed, checked = set(), 0
    for index, step in enumerate(decisions.order):
        assert not step.reads & freed, f"{step.__name__} reads {step.reads & freed}, freed before it"
        checked += len(step.reads)
        gone = decisions.freed_after.get(index, frozenset())
        freed |= gone | {holds[holder] for holder in gone & holds.keys()}
    return checked


@pytest.mark.parametrize("memory_first", [False, True], ids=["beside", "memory-first"])
def test_no_step_of_the_spine_reads_what_was_freed_before_it(memory_first):
    assert _check_nothing_freed_is_read(decide(spine.SPINE, memory_first)) > 20  # precondition: the reads were walked


def _declared(name: str, reads=(), writes=()):
    def step(*args):
        return None

    step.__name__ = step.__qualname__ = name
    return declares(reads=reads, writes=writes)(step)


def _random_spine(seed: int) -> list:
    """Steps with random declarations, one of them the export's start."""
    rng = random.Random(seed)
    data = [item for item in Data if item is not D.ONNX_EXPORT]
    made = [_declared(f"step_{index}", rng.sample(data, rng.randint(0, 3)), rng.sample(data, rng.randint(0, 2)))
            for index in range(rng.randint(3, 12))]
    start = _declared("start", rng.sample(data, rng.randint(0, 3)), [D.ONNX_EXPORT])
    made.insert(rng.randrange(len(made) + 1), start)
    return made


@pytest.mark.parametrize("seed", range(40))
def test_no_order_of_declared_steps_can_read_what_was_freed(seed):
    made = _random_spine(seed)
    for memory_first in (False, True):
        decisions = decide(made, memory_first)
        assert sorted(_names(decisions.order)) == sorted(_names(made)), "every step runs, once"
        _check_nothing_freed_is_read(decisions)
        for moved in decisions.deferred:  # a moved step neither feeds nor follows the steps it moved past
            start = next(step for step in made if D.ONNX_EXPORT in step.writes)
            passed = made[made.index(moved) + 1: made.index(start) + 1]
            kept = [step for step in passed if step not in decisions.deferred]
            assert all(not moved.writes & (step.reads | step.writes) and not moved.reads & step.writes for step in kept)


def test_a_step_the_export_waits_on_or_that_runs_no_model_stays_before_it():
    weights = _declared("runs_a_model", [D.MODEL_WEIGHTS], [D.REFERENCE])
    fed = _declared("feeds_the_export", [D.MODEL_WEIGHTS], [D.INPUTS])
    files = _declared("runs_no_model", [D.MODEL_STRUCTURE], [D.FILES])
    reads_reference = _declared("reads_the_reference", [], [D.FILES])
    start = _declared("start", [D.INPUTS, D.MODEL_STRUCTURE], [D.ONNX_EXPORT])
    assert decide([weights, fed, files, reads_reference, start], False).deferred == {weights}, "precondition"
    reads_reference = _declared("reads_the_reference", [D.REFERENCE], [D.FILES])
    assert not decide([weights, fed, files, reads_reference, start], False).deferred
    assert not decide([weights, fed, files, start], True).deferred


def _renamed(step):
    @functools.wraps(step)
    def copy(*args):
        return step(*args)

    copy.__name__ = copy.__qualname__ = f"renamed_{step.__name__[::-1]}"
    return declares(reads=step.reads, writes=step.writes)(copy)


@pytest.mark.parametrize("memory_first", [False, True], ids=["beside", "memory-first"])
def test_renaming_every_step_changes_no_decision(memory_first):
    renamed = [_renamed(step) for step in spine.SPINE]
    assert {step.__name__ for step in renamed}.isdisjoint(_names(spine.SPINE)), "precondition: new names"
    original, other = decide(spine.SPINE, memory_first), decide(renamed, memory_first)
    position = {copy: index for index, copy in enumerate(renamed)}
    assert [position[step] for step in other.order] == [spine.SPINE.index(step) for step in original.order]
    assert {position[step] for step in other.deferred} == {spine.SPINE.index(step) for step in original.deferred}
    assert other.freed_after == original.freed_after


def _stage_names() -> set[str]:
    """Every stage name the spine times: its literal names, and those it makes for each artifact kind."""
    source = inspect.getsource(spine._build)
    names = set(re.findall(r'(?:run|run_hashing_beside)\(\s*"([a-z_]+)"', source))
    for template in re.findall(r'f"([a-z_]+)\{kind\.name\}"', source):
        names |= {template + kind.name for kind in artifact_kinds()}
    return names


def test_the_schedule_spells_no_stage_name():
    names = _stage_names()
    assert {"load_model", "eager_outputs", "validate_graph", "export_graph_module", "validate_onnx"} <= names, names
    strings = {node.value for node in ast.walk(ast.parse(inspect.getsource(schedule)))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert len(strings) > 5, "precondition: the schedule's strings were read"
    assert not names & strings, f"the schedule spells stage names: {sorted(names & strings)}"


# -- the schedule, running a toy spine ------------------------------------------------------------------------------

_make = _declared("make", [], [D.MODEL_WEIGHTS, D.MODEL_STRUCTURE, D.GRAPH])
_use = _declared("use", [D.MODEL_WEIGHTS, D.GRAPH], [D.REFERENCE])
_later = _declared("later", [D.REFERENCE], [D.FILES])


def _toy_schedule(tmp_path, order):
    plan = SimpleNamespace(model=SimpleNamespace(spec=SimpleNamespace(weights_dtype=None)),
                           export=SimpleNamespace(onnx=SimpleNamespace(enabled=False)))
    memory = SimpleNamespace(peak_mib=lambda: 0.0)
    work = steps.Work(tmp_path)
    return BuildSchedule(plan, work, BuildReport("toy", str(tmp_path)), None, memory, 0.0, spine=order), work


def test_the_schedule_frees_an_object_once_its_last_reader_has_run(tmp_path):
    start = _declared("start", [], [D.ONNX_EXPORT])
    toy, work = _toy_schedule(tmp_path, [_make, start, _use, _later])
    work.model, work.graph = object(), object()
    toy.run("make", _make)
    toy.run_untimed(start)
    toy.run("use", _use)
    assert work.model is not None and work.graph is not None, "precondition: nothing freed before its last reader ran"
    toy.run("later", _later)
    assert work.model is None and work.graph is None
    assert set(toy._report.stages) == {"make", "use", "later"}


def test_the_schedule_refuses_a_spine_run_out_of_the_order_it_gave(tmp_path):
    start = _declared("start", [], [D.ONNX_EXPORT])
    toy, work = _toy_schedule(tmp_path, [_make, start, _use, _later])
    toy.run("make", _make)
    toy.run("use", _use, when=False)
    with pytest.raises(RuntimeError, match="make after use, out of the order"):
        toy.run("make", _make)
    with pytest.raises(RuntimeError, match="not among the steps"):
        toy.run("other", _declared("other", [D.GRAPH]))
