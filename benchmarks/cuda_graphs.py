"""The saved GraphModule with CUDA graph buckets against eager and torch.compile on a GPU, each runner in its own process.

    python benchmarks/cuda_graphs.py BUILD_DIR [--shapes 1x128 8x128 32x128 5x100] [--calls 100] [--runners ...] [--json OUT]

BUILD_DIR is an ``aot build`` of ``recipes/bert_cuda_graphs.yaml`` (a CUDA build with
``export.graph_module.cuda_graphs``). Runners, each started as its own Python process, one after
the other (never side by side):

- ``eager``: the recipe's eager model (rebuilt from its recipe: same seed, dtype and device);
- ``graph_module``: ``module.py``'s model without its buckets (``load(...).model``);
- ``graph_module_cuda_graphs``: ``module.py`` as it loads, every bucket captured at load (``capture="all"``);
- ``compile_default`` and ``compile_reduce_overhead``: ``torch.compile`` of the eager model, the latter
  with its own CUDA graphs (``mode="reduce-overhead"``); their compile shows as the first call.

Per shape: inputs of random token ids with a full attention mask; 3 warm-up calls (the first one's time
is reported), then ``--calls`` calls each timed with CUDA events; the median in ms. A shape that is no
bucket (5 x 100) is padded by the bucketed runner into the smallest that holds it (8 x 128): its time
includes the padding, and the runners without buckets run it unpadded.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNNERS = ("graph_module_cuda_graphs", "graph_module", "eager", "compile_reduce_overhead", "compile_default")
# torch.compile recompiles per shape (tens of seconds each): the compiled runners skip the padded-only shape.
PADDED_ONLY = {(5, 100)}


def _model(runner: str, build: Path):
    import torch

    if runner.startswith("graph_module"):
        load = runpy.run_path(str(build / "graph_module" / "module.py"))["load"]
        bucketed = load(build / "graph_module", capture="lazy").to("cuda")
        if runner == "graph_module":
            return bucketed.model
        started = time.perf_counter()
        bucketed.capture_all()
        torch.cuda.synchronize()
        print(json.dumps({"capture_all_s": round(time.perf_counter() - started, 2), "graphs": len(bucketed.graphs)}), file=sys.stderr)
        return bucketed
    from aot.models import load_model
    from aot.recipe.plan import plan_build
    from aot.recipe.load import load_recipe

    eager = load_model(plan_build(load_recipe(build / "recipe.yaml")).model)
    if runner == "eager":
        return eager
    mode = "reduce-overhead" if runner == "compile_reduce_overhead" else "default"
    return torch.compile(eager, mode=mode, dynamic=False)


def _time_one(runner: str, build: Path, shapes: list[tuple[int, int]], calls: int) -> dict:
    import torch

    model = _model(runner, build)
    results = {}
    generator = torch.Generator().manual_seed(0)
    for batch, sequence in shapes:
        if runner.startswith("compile") and (batch, sequence) in PADDED_ONLY:
            continue
        inputs = {"input_ids": torch.randint(0, 30000, (batch, sequence), generator=generator).cuda(),
                  "attention_mask": torch.ones(batch, sequence, dtype=torch.int64, device="cuda"),
                  "token_type_ids": torch.zeros(batch, sequence, dtype=torch.int64, device="cuda")}
        with torch.no_grad():
            torch.cuda.synchronize()
            started = time.perf_counter()
            model(**inputs)
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - started) * 1000
            for _ in range(2):
                model(**inputs)
            times = []
            for _ in range(calls):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(**inputs)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        results[f"{batch}x{sequence}"] = {"median_ms": round(statistics.median(times), 3), "first_call_ms": round(first_ms, 1)}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=Path)
    parser.add_argument("--shapes", nargs="+", default=["1x128", "8x128", "32x128", "5x100"])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: time one runner, print its JSON
    arguments = parser.parse_args()
    shapes = [tuple(int(size) for size in shape.split("x")) for shape in arguments.shapes]
    if arguments.one:
        print(json.dumps(_time_one(arguments.one, arguments.build, shapes, arguments.calls)))
        return 0
    import torch

    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": arguments.calls, "runners": {}}
    for runner in arguments.runners:
        command = [sys.executable, __file__, str(arguments.build), "--one", runner, "--calls", str(arguments.calls), "--shapes", *arguments.shapes]
        child = subprocess.run(command, capture_output=True, text=True)
        if child.returncode != 0:
            report["runners"][runner] = {"error": (child.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            report["runners"][runner] = json.loads(child.stdout.strip().splitlines()[-1])
            loads = [line for line in child.stderr.splitlines() if line.startswith('{"capture_all_s"')]
            if loads:
                report["runners"][runner]["load"] = json.loads(loads[0])
        print(runner, json.dumps(report["runners"][runner]), flush=True)
        if arguments.json:
            arguments.json.write_text(json.dumps(report, indent=2) + "\n")
    print(_table(report, arguments.shapes))
    return 0


def _table(report: dict, shapes: list[str]) -> str:
    lines = [f"{report['device']}, torch {report['torch']}, median of {report['calls']} calls (ms)", "",
             "| runner | " + " | ".join(shapes) + " |", "|---|" + "---|" * len(shapes)]
    for runner, figures in report["runners"].items():
        cells = [f"{figures[shape]['median_ms']:.3f}" if shape in figures else figures.get("error", "-")[:40] for shape in shapes]
        lines.append(f"| {runner} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
