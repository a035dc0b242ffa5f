"""Two processes saving and exporting the same graphs write byte-identical files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BUILD = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path

    import torch

    from aot.export import save_graph_module, write_onnx
    from aot.passes import QuantizeLinearInt8
    from tests.export import models

    out = Path(sys.argv[1])
    bert = models.tiny_bert()
    example = models.text_inputs(2, 7)
    graphs = {
        "convnet_fx": torch.fx.symbolic_trace(models.convnet()),
        "bert_fx": models.fx_graph(bert, ["input_ids", "attention_mask"]),
        "bert_export": models.export_graph(bert, example, models.TEXT_DIMS),
        "bert_int8": QuantizeLinearInt8(activations="per_token")(models.fx_graph(bert, ["input_ids", "attention_mask"])),
    }
    for name, gm in graphs.items():
        save_graph_module(gm, out / name)
    for name in ("bert_fx", "bert_export", "bert_int8"):
        write_onnx(graphs[name], out / f"{name}.onnx", example, models.TEXT_DIMS)
    """
)


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.mark.artifact
def test_two_processes_write_identical_bytes(tmp_path):
    repository = Path(__file__).resolve().parents[2]
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    outputs = [tmp_path / "first", tmp_path / "second"]
    children = []
    for seed, out in zip(("1", "2"), outputs):
        environment = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(repository))
        children.append(
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                cwd=tmp_path,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for child in children:
        stdout, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, f"build failed:\n{stdout}\n{stderr[-4000:]}"

    first, second = (_digests(out) for out in outputs)
    assert sorted(first) == [
        "bert_export.onnx",
        "bert_export/meta.json",
        "bert_export/module.py",
        "bert_export/weights.safetensors",
        "bert_fx.onnx",
        "bert_fx/meta.json",
        "bert_fx/module.py",
        "bert_fx/weights.safetensors",
        "bert_int8.onnx",
        "bert_int8/meta.json",
        "bert_int8/module.py",
        "bert_int8/weights.safetensors",
        "convnet_fx/meta.json",
        "convnet_fx/module.py",
        "convnet_fx/weights.safetensors",
    ]
    differing = [name for name in first if first[name] != second.get(name)]
    assert not differing, f"files differ between two processes: {differing}\n{json.dumps([first, second], indent=1)}"
