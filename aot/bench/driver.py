"""``aot bench``: eager vs the saved GraphModule vs the ONNX model (and peers), each in its own process.

Every figure is a ratio against eager measured in the same run. One process holding several
models slows them all, the eager baseline most (measured 1.3-1.5x on BERT-base), so each
runner lives in a worker process of its own (:mod:`aot.bench.worker`) and this driver only
sends it requests. What is asked (the grid, the peers, a decoder's new tokens) is checked against
the build before any worker starts (:mod:`aot.bench.request`). Then, for each shape of the grid:

1. every worker is warmed up (its first call's time is kept: a compiler compiles there), and,
   unless ``memory=False``, the peak resident set of an artifact's worker over its load and
   warm-up is taken (peers get none: their process built them first);
2. ``runs`` rounds follow; in each round every worker is timed once, in a shuffled order
   (seeded: the same order for the same arguments), after an idle ``gap_ms`` so that the
   previous runner's thread pool has settled;
3. per runner: median, p10 and p90 of its times; ``speedup = eager median / its median``;
   and the paired ratios, ``eager time / its time`` within each round, whose median
   (``paired_speedup``) is the figure to quote: it cancels the drifts both runners saw.

``mode="in-process"`` keeps every runner in this process instead (labelled as such in the
report): faster to start, but the figures are distorted and carry no memory. On CUDA (a
recipe whose ``model.device`` is ``cuda``) every runner runs on the GPU, each timing ending
with a ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aot.bench.request import check_request
from aot.bench.worker import RunnerHost, RunnerSpec
from aot.directory.manifest import cpu_model
from aot.directory.open import open_build
from aot.builder.stages import Progress, Stages
from aot.errors import AotError, RecipeError
from aot.export.kinds import ARTIFACT_KINDS, artifact_kind

log = logging.getLogger(__name__)

ARTIFACT_RUNNERS = ("eager", *ARTIFACT_KINDS)  # eager, then every artifact kind the build wrote
MODES = ("processes", "in-process")


@dataclass
class RunnerFigures:
    runner: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup: float  # eager median / this median
    paired_speedup: float  # median over rounds of eager's time / this runner's time in the same round
    paired_p10: float
    paired_p90: float
    first_call_ms: float
    peak_mib: float | None


@dataclass
class ShapeFigures:
    shape: dict[str, int]
    runners: list[RunnerFigures] = field(default_factory=list)
    # "call"; for a decoder build, "prefill" (ms to the first token) or "decode" (ms per later token)
    measure: str = "call"


@dataclass
class BenchReport:
    build: str
    cpu: str
    threads: int
    mode: str
    runs: int
    warmup: int
    gap_ms: float
    device: str = "cpu"  # where the runners ran: "cpu", or the GPU's name (`cpu` is then its host's)
    setup_s: dict[str, float] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)  # the process each runner ran in
    shapes: list[ShapeFigures] = field(default_factory=list)
    build_stages_s: dict[str, float] = field(default_factory=dict)
    # The build's accuracy gate, per artifact, from its manifest: speed next to what it cost in accuracy;
    # and per peer, measured by the bench on the same data, when the build has a gate.
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)
    peer_failures: dict[str, str] = field(default_factory=dict)
    peers_skipped: dict[str, str] = field(default_factory=dict)  # a group's member this build cannot have, and why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
    mode: str = "processes",
    gap_ms: float = 50.0,
    new_tokens: int | None = None,
    trust_code: bool = False,
    recipe: str | Path | None = None,
) -> BenchReport:
    """Time every runner of the build in ``directory`` (see the module docstring). ``grid``: sizes per dim (``-s``);
    ``peers``: peers' names and groups (:mod:`aot.bench.peer_groups`); ``new_tokens``: a decoder's only (default 32)."""
    if mode not in MODES:
        raise RecipeError(f"bench mode '{mode}' is not one of {', '.join(MODES)}")
    directory = Path(directory)
    stage = Stages(progress)
    with stage("check_files"):
        opened = open_build(directory, expect_sha256, trust_code)
        opened.require_consent("aot bench")
        integrity, plan = opened.integrity, opened.plan(recipe)
    request = check_request(plan, grid, peers, new_tokens)  # before any runner starts
    for peer, reason in request.skipped_peers.items():
        log.info("peer %s skipped: %s", peer, reason)
    threads = threads or _default_threads()
    in_process = mode == "in-process"
    report = BenchReport(
        build=str(directory), cpu=cpu_model(), threads=threads, mode=mode, runs=runs, warmup=warmup, gap_ms=gap_ms,
        build_stages_s=integrity.manifest.get("run", {}).get("stages_s", {}),
        accuracy={entry["artifact"]: entry["metrics"] for entry in integrity.manifest.get("accuracy", [])},
        peers_skipped=request.skipped_peers,
    )
    names = [name for name in ARTIFACT_RUNNERS if _artifact_present(directory, name)] + list(request.peers)
    with tempfile.TemporaryDirectory(prefix="aot-bench-") as workdir, _hosts(in_process) as start:
        spec = RunnerSpec(build=str(directory), runner="", threads=threads, workdir=workdir, shapes=request.shapes,
                          module_sha256=integrity.sha256_of("graph_module/module.py"), shared_process=in_process,
                          new_tokens=request.new_tokens, recipe=str(recipe) if recipe else None)
        hosts: dict[str, Any] = {}
        for name in names:  # one after the other: eager first, since it makes the inputs the others read
            with stage(f"load {name}"):
                try:
                    hosts[name], setup = start(dataclasses.replace(spec, runner=name))
                    report.setup_s[name], report.pids[name] = setup["setup_s"], setup["pid"]
                    report.device = setup.get("device", report.device)
                except AotError as error:
                    if name in ARTIFACT_RUNNERS:
                        raise
                    report.peer_failures[name] = str(error)
                    log.warning("peer %s could not be built: %s", name, error)
        # Host memory only, of a runner alone in its process: on CUDA the weights live in GPU memory.
        memory = memory and not in_process and plan.model.spec.device == "cpu"
        with stage("bench"):
            for index, shape in enumerate(request.shapes):
                report.shapes += _bench_shape(hosts, index, shape, runs, warmup, memory, gap_ms, tick, report.peer_failures)
        if report.accuracy:  # the build traded accuracy for speed: the peers are held to its gate too
            with stage("peer accuracy"):
                _peer_accuracy(hosts, request.peers, report)
    return report


def _peer_accuracy(hosts: dict[str, Any], peers: tuple[str, ...], report: BenchReport) -> None:
    """Each peer's metrics on the build's gate data, after the timing (their processes hold the eager model)."""
    for name in peers:
        host = hosts.get(name)
        if host is None or name in report.peer_failures:
            continue
        try:
            reply = host.accuracy()
        except AotError as error:
            log.warning("peer %s: accuracy not measured: %s", name, error)
            continue
        if reply.get("metrics"):
            report.accuracy[name] = reply["metrics"]
        else:
            log.warning("peer %s: accuracy not measured: %s", name, reply.get("problem"))


def counted(number: int, noun: str) -> str:
    """``1 thread``, ``2 threads``: a count in a title."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _default_threads() -> int:
    import torch

    return torch.get_num_threads()


def _artifact_present(directory: Path, runner: str) -> bool:
    return runner == "eager" or (directory / artifact_kind(runner).main_file).is_file()


@contextlib.contextmanager
def _hosts(in_process: bool) -> Iterator[Callable[[RunnerSpec], tuple[Any, dict[str, Any]]]]:
    """``start(spec) -> (host, its setup reply)``; every worker started is stopped on the way out."""
    workers: list[_Worker] = []

    def start(spec: RunnerSpec) -> tuple[Any, dict[str, Any]]:
        if in_process:
            host = RunnerHost(spec)
            return host, host.setup()
        worker = _Worker(spec)
        workers.append(worker)
        try:
            return worker, worker.request("setup", **asdict(spec))
        except AotError:
            worker.stop()
            workers.remove(worker)
            raise

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop()


class _Worker:
    """A runner in its own process: the same calls as :class:`RunnerHost`, over a pipe."""

    def __init__(self, spec: RunnerSpec):
        self.name = spec.runner
        self.log = tempfile.TemporaryFile(mode="w+")  # what the worker or its libraries print, for failures
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aot.bench.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, bufsize=1,
        )

    def request(self, op: str, **arguments: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            last = [text for text in self.log.read().splitlines() if text.strip()][-1:] or ["no output"]
            raise AotError(f"bench worker '{self.name}' died ({last[0]})")
        reply = json.loads(line)
        if "error" in reply:
            error = AotError(f"{self.name}: {reply['error']}")
            error.exit_code = reply["exit_code"]
            raise error
        return reply

    def warm(self, shape: int, calls: int, memory: bool) -> dict[str, Any]:
        return self.request("warm", shape=shape, calls=calls, memory=memory)

    def time(self, shape: int) -> float:
        return self.request("time", shape=shape)["ms"]

    def accuracy(self) -> dict[str, Any]:
        return self.request("accuracy")

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _bench_shape(
    hosts: dict[str, Any], index: int, shape: dict[str, int], runs: int, warmup: int, memory: bool, gap_ms: float,
    tick: Callable[[str], None] | None, peer_failures: dict[str, str],
) -> list[ShapeFigures]:
    """The shape's figures: one set, or for a decoder's generations one per measure (prefill, decode)."""
    warmed = {}
    for name in list(hosts):
        try:
            # A peer's process built it first (an export, a compile): its peak would be the build's, not the runner's.
            warmed[name] = hosts[name].warm(index, max(warmup, 1), memory and name in ARTIFACT_RUNNERS)
        except AotError as error:  # a peer that fails at this shape (a compiler, say) is a finding, not a stop
            if name in ARTIFACT_RUNNERS:
                raise
            peer_failures[name] = f"at {shape}: {error}"
            del hosts[name]
    names = list(hosts)
    samples: dict[str, list[Any]] = {name: [] for name in names}
    order = random.Random(f"{index}:{runs}:{','.join(names)}")  # shuffled, the same for the same bench
    label = ",".join(f"{k}={v}" for k, v in shape.items())
    for _ in range(runs):
        for name in order.sample(names, len(names)):
            time.sleep(gap_ms / 1000)
            samples[name].append(hosts[name].time(index))
        if tick:
            tick(label)
    if not isinstance(samples["eager"][0], dict):
        return [_figures(shape, "call", samples, warmed)]
    measures = list(samples["eager"][0])
    return [_figures(shape, measure, {name: [s[measure] for s in taken] for name, taken in samples.items()}, warmed) for measure in measures]


def _figures(shape: dict[str, int], measure: str, samples: dict[str, list[float]], warmed: dict[str, Any]) -> ShapeFigures:
    eager = samples["eager"]
    figures = ShapeFigures(shape=shape, measure=measure)
    for name in samples:
        paired = [e / t for e, t in zip(eager, samples[name])]
        median = statistics.median(samples[name])
        figures.runners.append(
            RunnerFigures(
                runner=name,
                median_ms=round(median, 3),
                p10_ms=round(_percentile(samples[name], 10), 3),
                p90_ms=round(_percentile(samples[name], 90), 3),
                speedup=round(statistics.median(eager) / median, 3),
                paired_speedup=round(statistics.median(paired), 3),
                paired_p10=round(_percentile(paired, 10), 3),
                paired_p90=round(_percentile(paired, 90), 3),
                first_call_ms=warmed[name]["first_call_ms"],
                peak_mib=warmed[name]["peak_mib"],
            )
        )
    return figures


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))
