"""module.py's load() packs its oneDNN linears and hands the weights file's pages read for them back.

The resident pages of the weights file's mapping are read from ``/proc/self/smaps`` in a fresh
process, which loads the artifact as users do (module.py's ``load``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch
from torch import nn

from aot.export import save_graph_module
from aot.passes import PrepackLinearWeights
from aot.runtime import OneDNNLinear

CHILD = textwrap.dedent(
    """
    import json, runpy, sys
    import torch

    def resident_kib(path):
        # smaps: a mapping's header line ends with its file; its fields follow until the next header
        total, inside = 0, False
        for line in open("/proc/self/smaps"):
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                inside = line.rstrip().endswith(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
        return total

    directory = sys.argv[1]
    weights = directory + "/weights.safetensors"
    model = runpy.run_path(directory + "/module.py")["load"](directory)
    packed = [name for name, module in model.named_modules() if getattr(module, "_packed", None) is not None]
    after_load = resident_kib(weights)
    values = {name: tensor.sum().item() for name, tensor in model.state_dict().items()}  # reads every page again
    print(json.dumps({"packed": packed, "after_load": after_load, "after_reading": resident_kib(weights), "sums": values}))
    """
)


class FourLinears(nn.Module):
    def __init__(self, width: int = 512, bias: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=bias) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _loaded_in_a_fresh_process(graph_module, tmp_path) -> dict:
    """Save ``graph_module``, load it with its ``module.py`` in a fresh process, and return CHILD's report."""
    save_graph_module(graph_module, tmp_path / "gm")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    completed = subprocess.run([sys.executable, str(script), str(tmp_path / "gm")], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _stored_sums(tmp_path) -> dict:
    stored = safetensors.torch.load_file(str(tmp_path / "gm" / "weights.safetensors"))
    return {name: tensor.sum().item() for name, tensor in stored.items()}


def _onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@pytest.mark.artifact
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT is Linux's")
@pytest.mark.skipif(not _onednn_linear_available(), reason="this torch has no oneDNN linear: nothing is packed")
def test_load_packs_linears_and_their_file_pages_leave_memory_with_every_value_kept(tmp_path):
    torch.manual_seed(0)
    graph_module = PrepackLinearWeights().apply(torch.fx.symbolic_trace(FourLinears().eval())).graph_module
    assert sum(isinstance(module, OneDNNLinear) for module in graph_module.modules()) == 4
    report = _loaded_in_a_fresh_process(graph_module, tmp_path)
    assert len(report["packed"]) == 4  # packed by load(), before any call
    weight_kib = 4 * 512 * 512 * 4 // 1024
    # Reading every tensor brings the pages back: the measure sees them (the test's precondition).
    assert report["after_reading"] >= 0.9 * weight_kib
    assert report["after_load"] < 0.1 * weight_kib
    assert _stored_sums(tmp_path) == report["sums"]


@pytest.mark.artifact
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT is Linux's")
def test_load_derives_int4_layers_kernel_forms_and_their_codes_pages_leave_memory(tmp_path):
    """An int4 layer's kernels multiply by copies of its codes and scales (int4 tiles, int8 codes): their pages go back."""
    from aot.passes import QuantizeLinearWeights
    from aot.runtime import WeightOnlyLinear

    torch.manual_seed(0)
    # Wide enough that each layer's int4 codes (2 MiB) span whole large folios of the page cache, which is what
    # MADV_PAGEOUT drops (a few hundred KiB inside one folio stay); no biases, which the file would keep between the
    # scales (its float32 tensors lie together), and which stay resident (a call reads them).
    graph_module = torch.fx.symbolic_trace(FourLinears(width=2048, bias=False).eval())
    QuantizeLinearWeights(bits=4, group_size=32)(graph_module)
    layers = [module for module in graph_module.modules() if isinstance(module, WeightOnlyLinear)]
    assert len(layers) == 4 and all(layer.activations == "int8" for layer in layers), "precondition: four int4 layers"
    report = _loaded_in_a_fresh_process(graph_module, tmp_path)
    assert len(report["packed"]) == 4  # derived by load(), before any call
    read_for_packing_kib = 4 * 2048 * (2048 // 2 + 2048 // 32 * 4) // 1024  # codes, and a float32 scale a group of 32
    assert report["after_reading"] >= 0.9 * read_for_packing_kib, "precondition: the measure sees the codes' pages"
    assert report["after_reading"] - report["after_load"] >= 0.9 * read_for_packing_kib, report
    assert _stored_sums(tmp_path) == report["sums"]
