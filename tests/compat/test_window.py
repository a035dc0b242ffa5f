"""The tested window: every declared dependency's version in the manifest, one warning line outside the window."""

from __future__ import annotations

import json
import logging

from packaging.requirements import Requirement

from aot.directory.manifest import tool_versions
from aot.compat import window
from tests.log_messages import messages_of


def test_the_installed_aot_declares_a_bounded_window_for_every_dependency():
    requirements = window.declared_requirements()
    names = {requirement.name for requirement in requirements}
    assert {"torch", "transformers", "onnx", "onnxruntime", "onnxscript"} <= names, names
    for requirement in requirements:
        operators = {spec.operator for spec in requirement.specifier}
        assert ">=" in operators and "<" in operators, f"{requirement}: a tested window has a lower and an upper bound"


def test_the_suite_runs_inside_the_window():
    assert window.outside_window() == []


def test_a_release_past_the_window_is_named_in_one_warning_line(monkeypatch):
    monkeypatch.setattr(window, "declared_requirements", lambda: [Requirement("torch>=2.11,<2.16"), Requirement("rich>=14,<16")])
    versions = {"torch": "2.16.0+cpu", "rich": "15.0.0"}
    monkeypatch.setattr(window, "installed_version", versions.get)
    with messages_of("aot.compat.window", logging.WARNING) as messages:
        found = window.warn_outside_window()
    assert found == ["torch 2.16.0+cpu (tested: <2.16,>=2.11)"]
    assert len(messages) == 1 and "\n" not in messages[0], messages
    assert "torch 2.16.0+cpu" in messages[0] and "rich" not in messages[0]


def test_the_manifest_names_every_declared_dependency():
    versions = tool_versions()
    declared = {requirement.name for requirement in window.declared_requirements()}
    assert declared, "the precondition: aot is installed with its metadata"
    assert declared <= set(versions) and versions["python"] and versions["torch"]
    json.dumps(versions)
