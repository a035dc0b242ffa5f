"""The artifact kinds' registry: each kind one unit, found by name, with its section, files, checks and open()."""

from __future__ import annotations

import inspect

import pytest

from aot.export import kinds
from aot.export.kinds import ARTIFACT_KINDS, ArtifactKind, artifact_kind, artifact_kinds, register_artifact_kind, runtimes
from aot.recipe.schema import ExportSpec


def test_every_registered_kind_is_a_whole_unit():
    registered = list(artifact_kinds())
    assert len(registered) >= 3  # precondition: the registry was read
    for kind in registered:
        assert isinstance(kind, ArtifactKind) and kind.name in ARTIFACT_KINDS
        assert kind.title and kind.runtime and kind.main_file, kind.name
        # It implements what the spine, the checks and the runners call, not the base's NotImplementedError.
        for method in ("open", "checked_runner"):
            assert getattr(type(kind), method) is not getattr(ArtifactKind, method), f"{kind.name} has no {method}"
        if not kind.written_beside:  # written by the spine's loop (a forked writer is started by the schedule)
            assert type(kind).write is not ArtifactKind.write, f"{kind.name} has no write"
        assert kind.manifest_key is None or type(kind).manifest_section is not ArtifactKind.manifest_section


def test_kinds_are_told_apart_by_name_runtime_and_file():
    registered = list(artifact_kinds())
    assert len(registered) >= 3
    for attribute in ("name", "runtime", "main_file"):
        values = [getattr(kind, attribute) for kind in registered]
        assert len(set(values)) == len(values), (attribute, values)
    assert runtimes() == [kind.runtime for kind in registered]


def test_every_kind_has_its_recipe_section():
    sections = ExportSpec.model_fields
    assert "onnx" in sections  # precondition: the schema was read
    for kind in artifact_kinds():
        assert kind.name in sections, f"export.{kind.name}: the recipe has no section for the kind"
        assert "enabled" in sections[kind.name].annotation.model_fields, kind.name
        assert hasattr(ExportSpec().model_dump()[kind.name], "keys")


def test_a_name_taken_is_refused_never_replaced(monkeypatch):
    monkeypatch.setattr(kinds, "ARTIFACT_KINDS", dict(ARTIFACT_KINDS))
    with pytest.raises(ValueError, match="'onnx' is registered already"):
        register_artifact_kind("onnx", "somewhere:ELSE")
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        register_artifact_kind("wheel", "no_colon_here")
    with pytest.raises(KeyError, match="no artifact kind 'wheel'"):
        artifact_kind("wheel")


def test_a_registered_location_must_hold_that_kind(monkeypatch):
    monkeypatch.setattr(kinds, "ARTIFACT_KINDS", dict(ARTIFACT_KINDS))
    monkeypatch.setattr(kinds, "_loaded", {})
    register_artifact_kind("mislabelled", "aot.export.onnx_artifact:ONNX")
    with pytest.raises(TypeError, match="is not the ArtifactKind 'mislabelled'"):
        artifact_kind("mislabelled")


def test_the_registry_imports_no_kind_until_asked():
    source = inspect.getsource(kinds)
    assert "ARTIFACT_KINDS" in source  # precondition
    assert "import aot.export." not in source and "from aot.export." not in source and "from ." not in source
