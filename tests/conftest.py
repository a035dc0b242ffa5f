"""Shared fixtures: tiny recipes written on the fly, and a CLI runner that shows its output on failure."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from aot.cli import main

# The builds of this session record themselves here (aot.directory.consent), not in the user's cache; the
# processes the tests start inherit it. It goes with the session.
os.environ["AOT_CACHE_DIR"] = tempfile.mkdtemp(prefix="aot-test-cache-")
atexit.register(shutil.rmtree, os.environ["AOT_CACHE_DIR"], ignore_errors=True)

# The suite's tiers, each the one before plus its own tests (pyproject's markers describe them): ``fast`` is every
# unmarked test (a bare ``python -m pytest``), ``artifact`` adds the tests marked ``artifact`` (CI), ``full`` adds those
# marked ``full``. --tier deselects the rest, apart from -m and -k, which still narrow what it keeps.
TIERS = ("fast", "artifact", "full")
# Each tier's default time limit in seconds (pyproject's ``timeout`` is the fast tier's); a test's own
# @pytest.mark.timeout wins, and so does a --timeout given to the run. A module's shared build is paid by the first
# test that asks for it, hence the room.
TIER_TIMEOUTS = {"artifact": 900, "full": 3600}
# In no tier: runs only when -m names it (python -m pytest -m coverage_table).
OPT_IN = "coverage_table"
_TIER_COUNTS = pytest.StashKey[dict]()  # tests collected per tier (and opt-in), before any is deselected


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="fast",
                     help="the tests to run: fast (default: the unmarked tests), artifact (fast and the tests marked "
                          "artifact: tiny end-to-end builds, every shipped recipe at tiny size; CI), full (everything: "
                          "full-size recipes, model zoos). Independent of -m and -k.")


def tier_of(item) -> str:
    """The tier an item belongs to: ``fast``, or its one tier marker. Two different tier markers are an error."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS[1:]}
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(sorted(marked))}: a test belongs to one tier")
    return marked.pop() if marked else "fast"


@pytest.hookimpl(tryfirst=True)  # before -m and -k: every collected test is classified (and checked) by tier_of
def pytest_collection_modifyitems(config, items):
    wanted = TIERS[: TIERS.index(config.getoption("tier")) + 1]
    opt_in = OPT_IN in (config.getoption("markexpr") or "")  # -m 'not coverage_table' deselects them itself
    kept, deselected = [], []
    counts = config.stash.setdefault(_TIER_COUNTS, dict.fromkeys((*TIERS, OPT_IN), 0))
    # A limit given for this run (--timeout, PYTEST_TIMEOUT; 0: none, e.g. to debug) holds for every tier.
    tier_timeouts = TIER_TIMEOUTS if config.getoption("timeout", None) is None and "PYTEST_TIMEOUT" not in os.environ else {}
    for item in items:
        tier, opted = tier_of(item), item.get_closest_marker(OPT_IN) is not None
        counts[OPT_IN if opted else tier] += 1
        if tier not in wanted or (opted and not opt_in):
            deselected.append(item)
            continue
        if tier in tier_timeouts and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(tier_timeouts[tier]))
        kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_report_collectionfinish(config):
    """One line, also under -q: how many tests each tier holds (before -m and -k), and which tiers this run takes."""
    counts = config.stash.get(_TIER_COUNTS, None)
    if counts:
        tier = config.getoption("tier")
        return (f"tiers collected: {', '.join(f'{name} {count}' for name, count in counts.items())} (-m {OPT_IN} only); "
                f"--tier {tier} runs {' and '.join(TIERS[: TIERS.index(tier) + 1])}")


TINY_BERT = """\
model:
  config:
    model_type: bert
    hidden_size: 32
    num_hidden_layers: 2
    num_attention_heads: 4
    intermediate_size: 64
    vocab_size: 128
  class: BertModel
  seed: 0
inputs:
  dims:
    batch: {size: 2, dynamic: true}
    sequence: {size: 8, dynamic: true}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
    - {name: attention_mask, shape: [batch, sequence]}
passes:
  - merge_linears
validate:
  shapes:
    - {batch: 1, sequence: 5}
    - {batch: 3, sequence: 12}
"""

# A pretrained tiny BERT (a `pretrained/` directory beside the recipe), one input.
PRETRAINED = """\
model:
  pretrained: pretrained
  class: BertModel
inputs:
  dims:
    batch: {size: 2, dynamic: true}
    sequence: {size: 8, dynamic: true}
  tensors:
    - {name: input_ids, shape: [batch, sequence]}
"""


@pytest.fixture
def write_recipe(tmp_path: Path):
    def write(text: str = TINY_BERT, name: str = "tiny.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def invoke_aot(*args, input=None):
    """``aot ARGS`` in this process through click's runner; ``described`` sums the result up for an assertion."""
    result = CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)
    result.described = f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


@pytest.fixture
def cli():
    return invoke_aot


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory) -> Path:
    """One build of TINY_BERT for the session; copy it (``copy_build``) before changing anything in it."""
    from aot.builder.spine import build

    root = tmp_path_factory.mktemp("tiny-build")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_BERT)
    return Path(build(recipe, root / "out").output)


@pytest.fixture
def copy_build(tiny_build, tmp_path):
    def copy(name: str = "build") -> Path:
        import shutil

        return Path(shutil.copytree(tiny_build, tmp_path / name))

    return copy


def rehash_manifest(build: Path, relative: str) -> None:
    """What anyone who can write a build directory can do: make its manifest agree with a changed file."""
    import hashlib
    import json

    manifest = json.loads((build / "manifest.json").read_text())
    data = (build / relative).read_bytes()
    manifest["artifacts"][relative] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (build / "manifest.json").write_text(json.dumps(manifest, indent=2))


def run_aot(*args, cwd=None, timeout=600, env=None, input=None):
    """``aot ARGS`` in a fresh process, as a release job runs it: the console entry point, signals and all.

    ``env``: variables set on top of this process's; ``input``: its standard input.
    """
    import subprocess
    import sys

    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, input=input)


def run_aot_here(*args, input=None):
    """``aot ARGS`` in this process (:func:`invoke_aot`), answered as :func:`run_aot` answers (``returncode``,
    ``stdout``, ``stderr``): for what the command computes and its own errors' exit codes, without the second or more a
    fresh interpreter takes to import torch. What only the console entry point does (click's usage errors as one line,
    signals) still needs :func:`run_aot`."""
    import subprocess

    result = invoke_aot(*args, input=input)
    return subprocess.CompletedProcess(["aot", *map(str, args)], result.exit_code, result.stdout, result.stderr)
