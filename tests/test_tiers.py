"""The suite's tiers (tests/conftest.py's --tier, pyproject's markers): what each runs, and the rules that keep them so.

fast (a bare ``python -m pytest``): the unmarked tests, at least 500 of them, a few minutes on 2 cores.
artifact (CI, ``--tier artifact``): fast and the tests marked ``artifact``. full (``--tier full``): everything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OPT_IN, TIERS

REPOSITORY = Path(__file__).resolve().parents[1]
FAST_AT_LEAST = 500

pytest_plugins = ["pytester"]


def _collect(*arguments: str) -> tuple[int, dict[str, int], str]:
    """``pytest --collect-only -q ARGUMENTS`` in the repository: (tests selected, tests per tier as conftest counts them,
    the output). A collection error fails; so does a test in two tiers (a usage error at collection)."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *arguments]
    environment = {name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"}  # e.g. a --junitxml of this run's
    completed = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600, env=environment)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"exit {completed.returncode}: {output[-3000:]}"
    summary = output.strip().splitlines()[-1]
    assert "error" not in summary, output[-3000:]
    selected = re.search(r"^(\d+)(?:/\d+)? tests? collected", summary)
    assert selected, f"no count in {summary!r}"
    line = re.search(r"^tiers collected: (.*) \(-m", output, flags=re.MULTILINE)
    assert line, f"conftest's line of tiers is missing: {output[-3000:]}"
    per_tier = {name: int(count) for name, count in (part.rsplit(" ", 1) for part in line.group(1).split(", "))}
    return int(selected.group(1)), per_tier, output


def test_the_config_is_strict_and_every_marker_is_described(pytestconfig):
    assert pytestconfig.inipath is not None and pytestconfig.inipath.name == "pyproject.toml", "precondition: pyproject's config"
    assert pytestconfig.option.strict_markers and pytestconfig.option.strict_config
    assert "--strict-markers" in pytestconfig.getini("addopts") and pytestconfig.getini("xfail_strict")
    lines = pytestconfig.getini("markers")
    declared = {line.split(":")[0].split("(")[0].strip(): line for line in lines}
    assert {*TIERS[1:], OPT_IN} <= set(declared), sorted(declared)
    undescribed = [line for line in lines if not line.partition(":")[2].strip()]
    assert not undescribed, undescribed


def test_the_tier_markers_name_their_command_and_time_limit(pytestconfig):
    declared = {line.split(":")[0].strip(): line for line in pytestconfig.getini("markers")}
    for tier in TIERS[1:]:
        assert f"--tier {tier}" in declared[tier], declared[tier]
    assert "-m" in declared[OPT_IN] and "no tier" in declared[OPT_IN], declared[OPT_IN]
    assert pytestconfig.getini("timeout") and pytestconfig.getini("timeout_method") == "thread"


def test_the_tiers_grow_and_no_test_is_in_two():
    # Collection classifies every test it finds before any is deselected, and a test in two tiers is a usage error
    # there (test_a_test_in_two_tiers_is_refused_at_collection): this collection succeeding says no test is in two.
    selected, per_tier, output = _collect("--tier", "artifact")
    assert "tests/test_tiers.py::test_the_tiers_grow_and_no_test_is_in_two" in output, "precondition: this file is collected"
    assert set(per_tier) == {*TIERS, OPT_IN}, per_tier
    assert selected == per_tier["fast"] + per_tier["artifact"], (selected, per_tier)
    assert per_tier["fast"] >= FAST_AT_LEAST, f"the fast tier runs {per_tier['fast']} tests"
    assert per_tier["artifact"] > 0 and per_tier["full"] > 0, per_tier


def _a_project_with_our_tiers(pytester) -> None:
    """A pytester project that takes this suite's --tier option and collection hook, and declares its markers."""
    pytester.makeconftest("from tests.conftest import pytest_addoption, pytest_collection_modifyitems")
    pytester.makeini("[pytest]\nmarkers =\n    artifact: a\n    full: b\n    coverage_table: c\n")


def test_a_test_in_two_tiers_is_refused_at_collection(pytester):
    _a_project_with_our_tiers(pytester)
    pytester.makepyfile(
        "import pytest\n\n"
        "def test_fast(): pass\n\n"
        "@pytest.mark.artifact\ndef test_artifact(): pass\n\n"
        "@pytest.mark.full\ndef test_full(): pass\n\n"
        "@pytest.mark.coverage_table\ndef test_table(): pass\n"
    )
    for arguments, expected in [((), {"test_fast"}), (("--tier", "artifact"), {"test_fast", "test_artifact"}),
                                (("--tier", "full"), {"test_fast", "test_artifact", "test_full"}),
                                (("-m", "coverage_table"), {"test_table"}), (("--tier", "full", "-k", "artifact"), {"test_artifact"})]:
        result = pytester.inline_run(*arguments)
        assert {report.nodeid.split("::")[-1] for report in result.getreports("pytest_runtest_logreport") if report.when == "call"} == expected, arguments
    pytester.makepyfile(test_two="import pytest\n\n@pytest.mark.artifact\n@pytest.mark.full\ndef test_both(): pass\n")
    result = pytester.runpytest_inprocess("--tier", "full")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_both is marked artifact and full: a test belongs to one tier*"])


def test_each_tier_gets_its_time_limit_unless_the_run_gives_one(pytester):
    from tests.conftest import TIER_TIMEOUTS

    _a_project_with_our_tiers(pytester)
    pytester.makepyfile(
        "import pytest\n\n"
        "def test_fast(): pass\n\n"
        "@pytest.mark.artifact\ndef test_artifact(): pass\n\n"
        "@pytest.mark.full\ndef test_full(): pass\n\n"
        "@pytest.mark.full\n@pytest.mark.timeout(7)\ndef test_own(): pass\n"
    )
    assert 300 < TIER_TIMEOUTS["artifact"] < TIER_TIMEOUTS["full"], "precondition: more room than the fast tier's 300 s"

    def limits(*arguments):
        items, _ = pytester.inline_genitems("--tier", "full", *arguments)
        return {item.name: (marker.args[0] if (marker := item.get_closest_marker("timeout")) else None) for item in items}

    assert limits() == {"test_fast": None, "test_artifact": TIER_TIMEOUTS["artifact"], "test_full": TIER_TIMEOUTS["full"], "test_own": 7}
    assert limits("--timeout", "0") == {"test_fast": None, "test_artifact": None, "test_full": None, "test_own": 7}
