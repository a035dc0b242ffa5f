"""Run saved GraphModules in a fresh Python that cannot import aot, transformers or safetensors.

``python -I`` ignores PYTHONPATH and the user site; on top of that a
``sys.meta_path`` finder refuses the blocked packages, since the venv has them
installed. The child loads each artifact with docs/deploy.md's three lines, runs it
on the given inputs and writes the raw outputs back (``torch.save`` here is test
plumbing only: artifacts themselves are never pickled).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

BLOCKED = ("aot", "transformers", "safetensors", "onnx", "onnxruntime", "tests")

CHILD = textwrap.dedent(
    """
    import importlib.abc
    import importlib.util
    import sys

    class Refuse(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise ImportError(f"{module.__name__} is blocked in this environment")

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return importlib.util.spec_from_loader(name, Refuse())
            return None

    sys.meta_path.insert(0, Blocker())

    import torch

    jobs = torch.load(sys.argv[1], weights_only=True)
    results = {}
    for key, (directory, cases) in jobs.items():
        import runpy
        load = runpy.run_path(f"{directory}/module.py")["load"]
        model = load(directory)
        devices = {t.device for inputs in cases for t in inputs.values() if isinstance(t, torch.Tensor)}
        if len(devices) == 1:
            model = model.to(devices.pop())  # a CUDA recipe's inputs are on the GPU; weights load on the CPU
        with torch.no_grad():
            results[key] = [model(**inputs) for inputs in cases]
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    assert not leaked, f"blocked modules were imported: {leaked}"
    try:
        import aot
    except ImportError:
        pass
    else:
        raise AssertionError("the blocker let aot be imported")
    torch.save(results, sys.argv[2])
    """
)


def run_isolated(jobs: dict[str, tuple[Path, list[dict[str, torch.Tensor]]]], workdir: Path) -> dict[str, list]:
    """``{key: (artifact dir, [inputs...])}`` -> ``{key: [raw outputs...]}``, computed in the isolated child."""
    jobs_file, results_file, script = workdir / "jobs.pt", workdir / "results.pt", workdir / "child.py"
    torch.save({key: (str(directory), cases) for key, (directory, cases) in jobs.items()}, jobs_file)
    script.write_text(f"BLOCKED = {BLOCKED!r}\n" + CHILD)
    completed = subprocess.run(
        [sys.executable, "-I", str(script), str(jobs_file), str(results_file)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"isolated child failed:\n{completed.stdout}\n{completed.stderr}"
    return torch.load(results_file, weights_only=True)
