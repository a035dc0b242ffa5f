"""``aot bench``: eager vs the saved GraphModule vs the ONNX model, in one process, interleaved.

Every figure is a ratio against eager measured in the same run, so machine
noise hits all contestants alike. For each shape of the grid:

1. every runner is warmed up;
2. ``runs`` rounds follow; in each round every runner is timed once, in an
   order that rotates from round to round;
3. medians, p10 and p90 are taken per runner, and ``speedup = eager median /
   runner median``.

Peak memory is measured per runner in a fresh process that loads only that
runner (:mod:`aot.bench_memory`): its peak resident set minus the resident set
after imports, loading and two calls included. Peers get no memory figure.

On CUDA (a recipe whose ``model.device`` is ``cuda``) every runner runs on the GPU:
eager and the GraphModule in torch, the ONNX model in ONNX Runtime's CUDA
provider with inputs and outputs bound in GPU memory; each timing ends with a
``torch.cuda.synchronize()``. No memory figure is taken there.
"""

from __future__ import annotations

import functools
import itertools
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aot.errors import RecipeError
from aot.bench_memory import measure_peak_mib
from aot.bench_peers import build_peers
from aot.inputs import dynamic_axes, make_inputs
from aot.integrity import IntegrityReport, verify_directory
from aot.models import forward_parameters, load_model, load_tokenizer
from aot.recipe import LoadedRecipe
from aot.stages import Progress, Stages
from aot.validate import recipe_of_build

log = logging.getLogger(__name__)

Runner = Callable[[dict[str, torch.Tensor]], Any]
ARTIFACT_RUNNERS = ("eager", "graph_module", "onnx")
Tick = Callable[[], None]


@dataclass
class RunnerFigures:
    runner: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup: float
    peak_mib: float | None


@dataclass
class ShapeFigures:
    shape: dict[str, int]
    runners: list[RunnerFigures] = field(default_factory=list)


@dataclass
class BenchReport:
    build: str
    threads: int
    runs: int
    warmup: int
    shapes: list[ShapeFigures] = field(default_factory=list)
    build_stages_s: dict[str, float] = field(default_factory=dict)
    peer_failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _load_build(directory: Path, expect_sha256: str | None = None) -> tuple[LoadedRecipe, IntegrityReport]:
    """The build's recipe, once every file of the directory matched its manifest (nothing from it runs before)."""
    integrity = verify_directory(directory, expect_sha256)
    return recipe_of_build(directory, integrity.manifest), integrity


def _runners(
    directory: Path, integrity: IntegrityReport, model: torch.nn.Module, threads: int, only: str | None = None
) -> dict[str, Runner]:
    from aot import export

    device = _model_device(model)
    # Called as validation calls it: without a KV cache, like the traced graph.
    extra = {"use_cache": False} if "use_cache" in forward_parameters(model) else {}
    runners: dict[str, Runner] = {"eager": lambda inputs: model(**inputs, **extra)}
    if only == "eager":
        return runners
    if (directory / "graph_module").is_dir() and only in (None, "graph_module"):
        # As users load it: module.py's own load(), the text run being the text hashed.
        saved = export.load_standalone(directory / "graph_module", integrity.sha256_of("graph_module/module.py")).to(device)
        runners["graph_module"] = lambda inputs: saved(**inputs)
    onnx_path = directory / "model.onnx"
    if onnx_path.is_file() and only in (None, "onnx"):
        runners["onnx"] = _onnx_runner(onnx_path, threads, device)
    return runners


def _model_device(model: torch.nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _onnx_runner(path: Path, threads: int, device: torch.device) -> Runner:
    """ONNX Runtime on the model's device: on CUDA, inputs and outputs stay in GPU memory, as eager's do."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning ORT workers would steal the cores torch runs on next: interleaving must be fair.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if device.type != "cuda":
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda inputs: session.run(None, {n: inputs[n].numpy() for n in names})
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise RecipeError(
            f"{path}: the model runs on {device}, but this ONNX Runtime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
        )
    provider = ("CUDAExecutionProvider", {"device_id": device.index or 0})
    session = onnxruntime.InferenceSession(str(path), options, providers=[provider])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, torch.Tensor]) -> Any:
        binding = session.io_binding()
        for name in names:
            tensor = inputs[name].contiguous()
            binding.bind_input(
                name, "cuda", device.index or 0, _numpy_dtype(tensor.dtype), list(tensor.shape), tensor.data_ptr()
            )
        for name in outputs:
            binding.bind_output(name, "cuda", device.index or 0)
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    return run


@functools.cache  # called inside the timed region, once per input and call
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


def grid_shapes(loaded: LoadedRecipe, grid: dict[str, list[int]]) -> list[dict[str, int]]:
    dims = {name: [dim.size] for name, dim in loaded.recipe.inputs.dims.items()}
    for name, sizes in grid.items():
        if name not in dims:
            raise RecipeError(f"--shape {name}=...: the recipe has no dim '{name}' (it has: {', '.join(dims)})")
        dims[name] = sizes
    names = list(dims)
    return [dict(zip(names, sizes)) for sizes in itertools.product(*(dims[n] for n in names))]


def bench(
    directory: str | Path,
    grid: dict[str, list[int]] | None = None,
    runs: int = 30,
    warmup: int = 3,
    threads: int | None = None,
    memory: bool = True,
    tick: Callable[[str], None] | None = None,
    peers: tuple[str, ...] = (),
    expect_sha256: str | None = None,
    progress: Progress | None = None,
) -> BenchReport:
    directory = Path(directory)
    stage = Stages(progress)
    with stage("check_files"):
        loaded, integrity = _load_build(directory, expect_sha256)
    manifest = integrity.manifest
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    with stage("load_runners"):
        model = load_model(loaded)
        device = _model_device(model)
        if peers and device.type != "cpu":
            raise RecipeError(f"--peers: the peers run on the CPU, and this build's model runs on {device}")
        runners = _runners(directory, integrity, model, threads)
    tokenizer = load_tokenizer(loaded) if loaded.recipe.inputs.texts else None
    report = BenchReport(
        build=str(directory), threads=threads, runs=runs, warmup=warmup, build_stages_s=manifest.get("run", {}).get("stages_s", {})
    )
    with tempfile.TemporaryDirectory(prefix="aot-bench-peers-") as workdir:
        if peers:
            with stage("build_peers"):
                trace_dims = {name: dim.size for name, dim in loaded.recipe.inputs.dims.items()}
                example = make_inputs(loaded, model, trace_dims, seed=loaded.recipe.model.seed, tokenizer=tokenizer)
                peer_runners, report.peer_failures = build_peers(peers, model, example, dynamic_axes(loaded), Path(workdir), threads)
                runners.update(peer_runners)
        with stage("bench"):
            _bench_grid(loaded, model, tokenizer, grid, runners, runs, warmup, memory, tick, report)
    return report


def _bench_grid(loaded, model, tokenizer, grid, runners, runs, warmup, memory, tick, report) -> None:
    with torch.inference_mode():
        for shape in grid_shapes(loaded, grid or {}):
            inputs = make_inputs(loaded, model, shape, seed=loaded.recipe.model.seed, tokenizer=tokenizer)
            report.shapes.append(_bench_shape(Path(report.build), report.threads, shape, inputs, runners, runs, warmup, memory, tick))


def _bench_shape(
    directory: Path,
    threads: int,
    shape: dict[str, int],
    inputs: dict[str, torch.Tensor],
    runners: dict[str, Runner],
    runs: int,
    warmup: int,
    memory: bool,
    tick: Callable[[str], None] | None,
) -> ShapeFigures:
    names = list(runners)
    # CUDA runs asynchronously: a runner's time ends when the GPU has finished its work.
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs.values())
    finish = torch.cuda.synchronize if on_cuda else (lambda: None)
    for name in names:
        for _ in range(warmup):
            runners[name](inputs)
    finish()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(runs):
        rotation = round_index % len(names)
        for name in names[rotation:] + names[:rotation]:
            started = time.perf_counter()
            runners[name](inputs)
            finish()
            samples[name].append((time.perf_counter() - started) * 1000)
        if tick:
            tick(",".join(f"{k}={v}" for k, v in shape.items()))
    eager_median = statistics.median(samples["eager"])
    figures = ShapeFigures(shape=shape)
    for name in names:
        median = statistics.median(samples[name])
        figures.runners.append(
            RunnerFigures(
                runner=name,
                median_ms=round(median, 3),
                p10_ms=round(_percentile(samples[name], 10), 3),
                p90_ms=round(_percentile(samples[name], 90), 3),
                speedup=round(eager_median / median, 3),
                # Host memory only: a CUDA runner's weights live in GPU memory, which this does not see.
                peak_mib=measure_peak_mib(directory, name, shape, threads)
                if memory and name in ARTIFACT_RUNNERS and not on_cuda
                else None,
            )
        )
    return figures


def draw_chart(report: BenchReport, path: Path) -> None:
    """A bar chart of speedups over eager per shape (needs matplotlib: `pip install 'aot[chart]'`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RecipeError("--chart needs matplotlib: pip install 'aot[chart]'") from None
    labels = [",".join(f"{k}={v}" for k, v in s.shape.items()) for s in report.shapes]
    runner_names = [r.runner for r in report.shapes[0].runners] if report.shapes else []
    figure, axes = plt.subplots(figsize=(max(4, 1.8 * len(labels) * len(runner_names) / 2), 3.5))
    width = 0.8 / max(len(runner_names), 1)
    for index, name in enumerate(runner_names):
        values = [next(r.speedup for r in s.runners if r.runner == name) for s in report.shapes]
        positions = [i + index * width for i in range(len(labels))]
        bars = axes.bar(positions, values, width, label=name)
        axes.bar_label(bars, fmt="%.2fx", fontsize=8)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks([i + width * (len(runner_names) - 1) / 2 for i in range(len(labels))], labels)
    axes.set_ylabel("speedup over eager")
    axes.set_title(f"aot bench: {Path(report.build).name}, {report.threads} threads, median of {report.runs}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(figure)
