"""Virtual environments for the lock and the canary: made outside the repository, filled by pip.

Standard library only, so that ``python3 scripts/lock.py`` and ``python3 scripts/canary.py`` run from
any Python >= 3.11 before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
# The libraries whose releases move aot's ground, in the order the tables show them.
WATCHED = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "onnx-ir")


def declared_dependencies() -> dict[str, str]:
    """``{distribution: specifier}`` of pyproject's ``[project] dependencies``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    for requirement in project["dependencies"]:
        name, specifier = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", requirement.split(";")[0]).groups()
        declared[canonical(name)] = specifier.strip()
    return declared


def lower_bounds() -> dict[str, str]:
    """``{distribution: its lowest tested version}``: the ``>=`` of each declared dependency."""
    bounds = {}
    for name, specifier in declared_dependencies().items():
        match = re.search(r">=\s*([^,\s]+)", specifier)
        if match:
            bounds[name] = match.group(1)
    return bounds


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def make_venv(path: Path) -> Path:
    """A new virtual environment at ``path`` (an old one there is replaced) with a current pip; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    python = path / "bin" / "python"
    pip(python, "install", "--quiet", "--upgrade", "pip")
    return python


def pip(python: Path, *arguments: str, uncapped: bool = False) -> None:
    """``python -m pip ARGUMENTS``; ``uncapped`` reads no pip configuration file for this call.

    A machine may cap releases in its pip configuration (a ``constraint`` file that holds torch to the
    wheels it keeps on disk); an empty PIP_CONSTRAINT does not lift a configured one, so the canary's
    newest releases are installed with no configuration file at all.
    """
    environment = dict(os.environ)
    if uncapped:
        environment["PIP_CONFIG_FILE"] = os.devnull
        environment.pop("PIP_CONSTRAINT", None)
    subprocess.run([str(python), "-m", "pip", *arguments], check=True, env=environment)


def install_aot(python: Path, *, editable: bool) -> None:
    """``pip install REPO[test]`` into ``python``'s environment, with botocore held where aiobotocore puts it.

    aiobotocore (under s3fs) admits three botocore releases; moto needs boto3, whose newest release needs the
    newest botocore. Left to itself, pip walks back through boto3's releases one at a time (over 15 minutes
    here, 2026-11-28, and the canary never got past it). So s3fs, at what pyproject's ``s3`` extra admits, goes
    in first, and the botocore it brought is held while the rest resolves (30 s).
    """
    s3 = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["s3"]
    pip(python, "install", "--quiet", *s3)
    with tempfile.NamedTemporaryFile("w", prefix="aot-botocore-", suffix=".txt", delete=False) as hold:
        hold.write(f"botocore=={installed_versions(python)['botocore']}\n")
    try:
        pip(python, "install", "--quiet", "-c", hold.name, *(["-e"] if editable else []), f"{REPO}[test]")
    finally:
        os.unlink(hold.name)


def installed_versions(python: Path) -> dict[str, str]:
    """``{distribution: version}`` of everything installed in ``python``'s environment (local labels kept)."""
    script = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    output = subprocess.run([str(python), "-c", script], check=True, capture_output=True, text=True).stdout
    return {canonical(name): version for name, version in json.loads(output).items()}
