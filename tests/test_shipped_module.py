"""The code users run is the code validated: the build and `aot validate` run graph_module/module.py itself."""

from __future__ import annotations

import pytest
import json
import subprocess
import sys
import textwrap

import torch

from aot.inputs import shape_cases
from aot.models import load_model
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from aot.gates.compare import compare_outputs, eager_outputs

# Loads module.py as docs/deploy.md shows, with every import of aot, transformers, safetensors and onnx refused.
TORCH_ALONE = textwrap.dedent(
    """
    import runpy, sys
    import torch

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"aot", "transformers", "safetensors", "onnx", "onnxruntime", "onnxscript"}:
                raise ImportError(f"{name} is not allowed: the artifact must load with torch alone")
            return None

    sys.meta_path.insert(0, Refuse())
    directory, cases_file, results_file = sys.argv[1:4]
    load = runpy.run_path(f"{directory}/module.py")["load"]
    model = load(directory)
    results = []
    with torch.no_grad():
        for inputs in torch.load(cases_file, weights_only=True):
            outputs = model(**inputs)
            results.append(dict(outputs) if isinstance(outputs, dict) else {"output": outputs})
    torch.save(results, results_file)
    print(sorted(name for name in sys.modules if name.split(".")[0] in {"aot", "transformers", "safetensors"}))
    """
)


def test_build_validates_module_py_at_every_shape(tiny_build):
    manifest = json.loads((tiny_build / "manifest.json").read_text())
    graph_shapes = {v["shape"] for v in manifest["validation"] if v["artifact"] == "graph"}
    shipped = [v for v in manifest["validation"] if v["artifact"] == "graph_module"]
    assert len(graph_shapes) >= 3, "the recipe validates at three shapes"
    assert {v["shape"] for v in shipped} == graph_shapes
    assert all(v["ok"] and v["source"] == "graph_module/module.py load()" for v in shipped), shipped


@pytest.mark.artifact
def test_module_py_with_torch_alone_matches_eager_at_every_validation_shape(tiny_build, tmp_path):
    loaded = load_recipe(tiny_build / "recipe.yaml")
    model = load_model(plan_build(loaded).model)
    cases = shape_cases(plan_build(loaded).inputs, model)
    assert len(cases) >= 3
    expected = [eager_outputs(model, case.inputs) for case in cases]
    torch.save([case.inputs for case in cases], tmp_path / "cases.pt")
    script = tmp_path / "torch_alone.py"
    script.write_text(TORCH_ALONE)
    completed = subprocess.run(
        [sys.executable, str(script), str(tiny_build / "graph_module"), str(tmp_path / "cases.pt"), str(tmp_path / "got.pt")],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().splitlines()[-1] == "[]", "module.py imported more than torch"
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    tolerances = loaded.recipe.validate_
    for case, want, have in zip(cases, expected, got):
        have = {name: value for name, value in have.items() if value is not None}
        result = compare_outputs("graph_module", case.label, want, have, tolerances.atol, tolerances.rtol)
        assert result.ok, result.summary()
