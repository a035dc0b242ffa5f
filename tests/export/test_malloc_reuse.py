"""module.py's load() keeps freed memory for reuse, so large activations stop page-faulting on every call."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from aot.export import save_graph_module

from . import models

# After load(), 40 times, the allocations of a feed-forward block of BERT-base at batch 8 (3 MiB
# input, 12 MiB activation, 12 MiB GELU output); prints the minor page faults they took. With
# glibc's defaults the freed 12 MiB blocks go back to the kernel and fault in again each time.
CHILD = textwrap.dedent(
    """
    import ctypes, resource, runpy, sys
    import torch

    libc = ctypes.CDLL(None)
    # Transparent huge pages would count a 2 MiB page as one fault, as and when the kernel has one free:
    # off, every 4 KiB page faults once, whatever else the machine does (PR_SET_THP_DISABLE = 41).
    if libc.prctl(41, 1, 0, 0, 0) != 0:
        print("no-prctl")
        sys.exit(0)
    # glibc raises its mmap threshold by itself as blocks are freed, more or less depending on what ran
    # before: start both runs from its documented default, 128 KiB (M_MMAP_THRESHOLD = -3).
    assert libc.mallopt(-3, 128 * 1024) == 1

    load = runpy.run_path(sys.argv[1] + "/module.py")["load"]
    load(sys.argv[1], keep_freed_memory=sys.argv[2] == "keep")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        x = torch.ones(1024, 768)
        h = torch.ones(1024, 3072)
        g = torch.nn.functional.gelu(h)
        del h
        g.sum()
        del g
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


@pytest.mark.artifact
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_load_keeps_large_freed_blocks_for_reuse(tmp_path):
    save_graph_module(torch.fx.symbolic_trace(models.convnet()), tmp_path / "gm")
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def faults(mode: str) -> int:
        completed = subprocess.run([sys.executable, str(script), str(tmp_path / "gm"), mode], capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
        if completed.stdout.strip() == "no-prctl":
            pytest.skip("this kernel or sandbox refuses PR_SET_THP_DISABLE: the fault counts would not be exact")
        return int(completed.stdout)

    pages = 12 * 2**20 // 4096
    returned, kept = faults("return"), faults("keep")
    assert returned > 20 * pages, f"precondition: glibc hands the blocks back and faults them in again ({returned} faults)"
    assert kept * 4 < returned, f"with load()'s setting the blocks are reused: {kept} faults against {returned}"
