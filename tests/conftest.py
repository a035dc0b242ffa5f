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


@pytest.fixture
def cli():
    def invoke(*args: str):
        result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
        result.described = f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        return result

    return invoke


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
