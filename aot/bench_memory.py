"""Peak memory of one runner, measured in a fresh process that loads only that runner.

Measuring in the benchmarking process itself would charge every runner for the
others' allocations (and the allocator keeps freed pages), so each runner gets
a child: it imports what every runner needs, notes its resident set, loads the
one runner, calls it twice on the shape, and reports its peak resident set
minus that baseline (the eager model's weights count for eager alone). Linux
only: it reads and resets the peak in ``/proc/self``. Run as ``python -m aot.bench_memory DIR RUNNER SHAPE_JSON``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch


def measure_peak_mib(directory: Path, runner: str, shape: dict[str, int], threads: int) -> float | None:
    command = [sys.executable, "-m", "aot.bench_memory", str(directory), runner, json.dumps(shape), str(threads)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        return None
    return float(completed.stdout.strip().splitlines()[-1])


def _main(directory: str, runner: str, shape_json: str, threads: str) -> None:
    import onnxruntime  # noqa: F401  (imported before the baseline, as every runner's process has it)

    from aot.bench import _load_build, _runners
    from aot.inputs import make_inputs
    from aot.models import load_model, load_tokenizer

    import aot.export  # noqa: F401  (its imports are no runner's memory either)

    torch.set_num_threads(int(threads))
    loaded, integrity = _load_build(Path(directory))
    tokenizer = load_tokenizer(loaded) if loaded.recipe.inputs.texts else None
    model = load_model(loaded)  # every runner's inputs need it; only eager's figure counts its weights
    inputs = make_inputs(loaded, model, json.loads(shape_json), seed=loaded.recipe.model.seed, tokenizer=tokenizer)
    baseline = _status_mib("VmRSS")
    if runner == "eager":
        baseline -= sum(t.numel() * t.element_size() for t in model.parameters()) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the present resident set
    run = _runners(Path(directory), integrity, model, int(threads), only=runner)[runner]
    with torch.inference_mode():
        run(inputs)
        run(inputs)
    print(round(max(_status_mib("VmHWM") - baseline, 0.0), 1))


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}")


if __name__ == "__main__":
    _main(*sys.argv[1:5])
