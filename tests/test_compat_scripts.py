"""scripts/lock.py and scripts/canary.py: what they read from pyproject, the lock they keep, the table they print."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import canary  # noqa: E402
import environments  # noqa: E402


def test_every_declared_dependency_has_a_lower_bound_the_canary_can_install():
    declared = environments.declared_dependencies()
    bounds = environments.lower_bounds()
    assert set(environments.WATCHED) <= set(declared), "the precondition: the watched libraries are declared"
    assert set(bounds) == set(declared)
    assert bounds["torch"] == "2.13" and bounds["transformers"] == "5.23"


def test_the_lock_pins_each_declared_dependency_inside_its_window():
    from packaging.specifiers import SpecifierSet

    lines = [line for line in environments.LOCK.read_text().splitlines() if line and not line.startswith("#")]
    locked = dict(line.split("==") for line in lines)
    assert len(locked) == len(lines) > 20, "the precondition: the lock has one pin a line"
    assert "Written by scripts/lock.py" in environments.LOCK.read_text()
    for name, specifier in environments.declared_dependencies().items():
        assert name in locked, f"{name} is not in the lock"
        assert SpecifierSet(specifier).contains(locked[name]), f"the lock's {name}=={locked[name]} lies outside {specifier}"


@pytest.mark.parametrize("returncode, failed", [(0, []), (1, ["tests/test_x.py::test_y"])])
def test_the_canary_table_names_versions_failures_and_recipes(returncode, failed):
    report = {
        "mode": "newest", "date": "2026-11-26", "versions": {"torch": "2.15.0", "transformers": None},
        "suite": {"returncode": returncode, "summary": "3 passed", "failed": failed, "seconds": 9},
        "recipes": [{"recipe": "bert.yaml", "status": "built", "detail": "40 s"},
                    {"recipe": "bert_cuda.yaml", "status": "skipped", "detail": "needs a CUDA GPU"}],
    }
    table = canary.render(report)
    assert "| torch | 2.15.0 |" in table and "| transformers | not installed |" in table
    assert "| `bert.yaml` | built | 40 s |" in table and "| `bert_cuda.yaml` | skipped | needs a CUDA GPU |" in table
    assert ("- failed: `tests/test_x.py::test_y`" in table) == bool(failed)
