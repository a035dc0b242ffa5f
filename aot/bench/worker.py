"""One bench runner, hosted alone: load it, take the inputs, warm up, time single calls.

``aot bench`` starts one worker process per runner (``python -m aot.bench.worker``) and
talks to it in JSON lines over its stdin and stdout, so that no runner shares a process,
an allocator, a thread pool or a cache with another: one process holding several models
slows them all, the eager baseline most. The same :class:`RunnerHost` also serves the
labelled ``--in-process`` mode, where every host lives in the driver's process.

Requests, one JSON object a line, each answered by one line:

- ``{"op": "setup", ...RunnerSpec}``: load the runner -> ``{"setup_s", "baseline_mib", "pid", "device"}`` (the GPU's
  name where the runner's inputs are on CUDA, else ``"cpu"``);
- ``{"op": "warm", "shape": i, "calls": n, "memory": bool}`` -> ``{"first_call_ms", "peak_mib"}``;
- ``{"op": "time", "shape": i}``: one call -> ``{"ms"}``; for a decoder build one generation,
  ``{"ms": {"prefill": ..., "decode": ...}}`` (:mod:`aot.bench.generation`);
- ``{"op": "accuracy"}``: the build's accuracy gate on this runner, a peer, whose process
  holds the eager model for the reference -> ``{"metrics", "problem"}`` (untimed, after the timing);
- ``{"op": "exit"}``.

A failure answers ``{"error": message, "exit_code": code}``. The timed region is the call
alone (and, on CUDA, the wait for the GPU), inside the worker: no pipe is timed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INPUTS_FILE = "inputs.pt"


@dataclass
class RunnerSpec:
    """What a host needs to load one runner of a checked build directory."""

    build: str
    runner: str  # eager | an artifact kind (aot.export.kinds) | a peer's name
    threads: int
    workdir: str  # shared by the hosts of one bench: the inputs file, the peers' ONNX files
    shapes: list[dict[str, int]]
    module_sha256: str | None = None  # graph_module/module.py as the manifest lists it
    shared_process: bool = False  # in-process mode: ONNX Runtime must not spin between calls
    new_tokens: int = 32  # a decoder build: tokens each timed generation makes
    recipe: str | None = None  # the recipe the eager model is rebuilt from (aot bench --recipe); None: the build's own


class RunnerHost:
    def __init__(self, spec: RunnerSpec):
        self.spec = spec
        self.inputs: list[dict[str, Any]] = []
        self.run: Any = None
        self.on_cuda = False
        self.baseline_mib = 0.0
        self.generates = False  # a decoder build's runner: each call is a timed generation (aot.bench.generation)
        self._eager: tuple[Any, Any] | None = None  # (recipe, eager model), where the runner was built from it

    def setup(self) -> dict[str, float]:
        import torch

        torch.set_num_threads(self.spec.threads)
        self.baseline_mib = _status_mib("VmRSS")
        started = time.perf_counter()
        self.run, self.inputs = self._load()
        self.on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in self.inputs[0].values()) if self.inputs else False
        device = torch.cuda.get_device_name(torch.cuda.current_device()) if self.on_cuda else "cpu"
        return {"setup_s": round(time.perf_counter() - started, 3), "baseline_mib": round(self.baseline_mib, 1), "pid": os.getpid(),
                "device": device}

    def warm(self, shape: int, calls: int, memory: bool) -> dict[str, float | None]:
        """``calls`` untimed calls at ``shape`` (the first one's time reported: a compiler compiles there).

        With ``memory``, the process's peak resident set over those calls, less its resident set before
        the runner was loaded (Linux: the peak is reset through ``/proc/self/clear_refs``).
        """
        if memory:
            Path("/proc/self/clear_refs").write_text("5")
        first_call = self.time(shape)
        first_call_ms = sum(first_call.values()) if isinstance(first_call, dict) else first_call
        for _ in range(calls - 1):
            self.time(shape)
        peak = round(max(_status_mib("VmHWM") - self.baseline_mib, 0.0), 1) if memory else None
        return {"first_call_ms": round(first_call_ms, 3), "peak_mib": peak}

    def time(self, shape: int) -> float | dict[str, float]:
        """One call's milliseconds; a decoder's runner answers its generation's ``{prefill, decode}`` ms instead."""
        import torch

        inputs = self.inputs[shape]
        if self.generates:
            return self.run(inputs)
        with torch.inference_mode():
            if self.on_cuda:  # CUDA runs asynchronously: timed on the GPU's clock, to its last kernel's end
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.run(inputs)
                end.record()
                end.synchronize()
                return start.elapsed_time(end)
            started = time.perf_counter()
            self.run(inputs)
            return (time.perf_counter() - started) * 1000

    def _load(self) -> tuple[Any, list[dict[str, Any]]]:
        from aot.bench.peer_groups import BUILD_PEERS
        from aot.export.kinds import ARTIFACT_KINDS, OpenOptions, artifact_kind
        from aot.bench.peers import build_peer
        from aot.inputs import dynamic_axes, make_inputs, texts_tokenizer
        from aot.models import load_model
        from aot.recipe.plan import plan_build
        from aot.gates.compare import eager_extra_arguments
        from aot.directory.open import recipe_of_build

        spec, build = self.spec, Path(self.spec.build)
        manifest = json.loads((build / "manifest.json").read_text())
        plan = plan_build(recipe_of_build(build, manifest, spec.recipe))
        inputs_file = Path(spec.workdir) / INPUTS_FILE
        if plan.model.decoder_step:
            self.generates = True
            return self._load_generation(plan, build, inputs_file)
        needs_model = spec.runner not in (*ARTIFACT_KINDS, *BUILD_PEERS)  # eager, and the peers built from it
        if needs_model:
            model = load_model(plan.model, narrow_weights=False)  # the eager model as users run it
            if not inputs_file.exists():  # the eager host goes first and makes every shape's inputs
                import torch

                tokenizer = texts_tokenizer(plan.inputs)
                made = [make_inputs(plan.inputs, model, shape, seed=plan.inputs.seed, tokenizer=tokenizer) for shape in spec.shapes]
                torch.save(made, inputs_file)
        inputs = _read_inputs(inputs_file)
        if spec.runner == "eager":
            extra = eager_extra_arguments(model, inputs[0])
            return (lambda given: model(**given, **extra)), inputs
        if spec.runner in ("graph_module", "graph_module_uncaptured"):
            device = inputs[0][next(iter(inputs[0]))].device
            saved = artifact_kind("graph_module").open_module(build, lambda relative: spec.module_sha256).to(device)
            if spec.runner == "graph_module_uncaptured":  # the model behind the CUDA graph buckets, called as it is
                saved = saved.model
            return (lambda given: saved(**given)), inputs
        if spec.runner == "onnx":
            return _onnx_runner(build / "model.onnx", spec, inputs), inputs
        if spec.runner in ARTIFACT_KINDS:  # any other kind, opened as users open it: its own open()
            opened = artifact_kind(spec.runner).open(build, OpenOptions(manifest, lambda relative: None, threads=spec.threads))
            return opened, inputs
        runner = build_peer(spec.runner, model, inputs[0], dynamic_axes(plan.inputs, model), Path(spec.workdir), spec.threads,
                            spinning=not spec.shared_process)
        self._eager = (plan.validation.gate, model)
        return runner, inputs

    def _load_generation(self, plan: Any, build: Path, inputs_file: Path) -> tuple[Any, list[dict[str, Any]]]:
        """A decoder build's runner: eager generate, or a greedy loop over the saved step or the ONNX model."""
        from aot.bench import generation
        from aot.export.kinds import artifact_kind
        from aot.models import load_model

        spec = self.spec
        if spec.runner == "eager":
            import torch

            step = load_model(plan.model, narrow_weights=False)  # the eager model as users run it
            if not inputs_file.exists():
                seed = plan.inputs.seed
                torch.save([generation.prompt_inputs(step.config.vocab_size, shape, seed) for shape in spec.shapes], inputs_file)
            generate = generation.eager_generate(step.causal_lm)
        elif spec.runner == "graph_module":
            saved = artifact_kind("graph_module").open_module(build, lambda relative: spec.module_sha256)
            names = type(saved).generate.__globals__  # module.py's own step inputs and past layout
            generate = generation.step_generate(generation.graph_module_step(saved, names["STEP_INPUTS"]), names["PAST_LAYOUT"])
        elif spec.runner == "onnx":
            onnx_step = generation.onnx_step(build / "model.onnx", spec.threads)
            generate = generation.step_generate(onnx_step, onnx_step.past_layout)
        elif spec.runner == "eager_bf16":
            from aot.bench.decoder_peers import eager_bf16_generate

            generate = eager_bf16_generate(load_model(plan.model, narrow_weights=False).causal_lm)
        elif spec.runner == "ort_genai":
            from aot.bench.decoder_peers import genai_generate

            generate = genai_generate(_checkpoint_for(plan, "ort_genai"), Path(spec.workdir), spec.threads)
        elif spec.runner == "llama_cpp":
            from aot.bench.llama_cpp_peer import llama_cpp_generate

            context = max(shape["prompt"] for shape in spec.shapes) + spec.new_tokens
            checkpoint = _checkpoint_for(plan, "llama_cpp")
            generate = llama_cpp_generate(checkpoint, Path(spec.workdir), spec.threads, context)
        else:
            from aot.errors import RecipeError

            raise RecipeError(f"peer '{spec.runner}': not a decoder peer")
        return generation.timed_generation(generate, spec.new_tokens), _read_inputs(inputs_file)

    def accuracy(self) -> dict[str, Any]:
        """The build's accuracy gate measured on this peer, against the eager model of its own process.

        ONNX Runtime answers a list: its outputs are taken in the order of eager's, which is the
        order every exporter writes them in.
        """
        from aot.gates.accuracy import make_gate
        from aot.gates.compare import eager_runner

        if self._eager is None:
            return {"metrics": {}, "problem": "not a peer: its accuracy is in the build's manifest"}
        gate_plan, model = self._eager
        gate = make_gate(gate_plan, eager_runner(model), model)
        if gate is None:
            return {"metrics": {}, "problem": "the build has no accuracy gate"}
        names = list(gate.expected[0])

        def run(batch: dict[str, Any]) -> Any:
            outputs = self.run(batch)
            return dict(zip(names, outputs)) if isinstance(outputs, (list, tuple)) else outputs

        result = gate.measure(self.spec.runner, run)
        return {"metrics": result.metrics, "problem": result.problem}


def _onnx_runner(path: Path, spec: RunnerSpec, inputs: list[dict[str, Any]]) -> Any:
    """ONNX Runtime where the inputs are: on CUDA, inputs and outputs stay in GPU memory, as eager's do."""
    import onnxruntime

    from aot.bench.peers import session_runner
    from aot.errors import RecipeError

    device = inputs[0][next(iter(inputs[0]))].device
    if device.type != "cuda":
        return session_runner(path, spec.threads, spinning=not spec.shared_process)
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise RecipeError(f"{path}: the model runs on {device}, but this ONNX Runtime has no CUDAExecutionProvider (pip install onnxruntime-gpu)")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = spec.threads
    session = onnxruntime.InferenceSession(str(path), options, providers=[("CUDAExecutionProvider", {"device_id": device.index or 0})])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    element_types = {}

    def run(given: dict[str, Any]) -> Any:
        binding = session.io_binding()
        for name in names:
            tensor = given[name].contiguous()
            if tensor.dtype not in element_types:  # looked up once: this runs inside the timed region
                element_types[tensor.dtype] = tensor.new_empty(()).cpu().numpy().dtype
            binding.bind_input(name, "cuda", device.index or 0, element_types[tensor.dtype], list(tensor.shape), tensor.data_ptr())
        for name in outputs:
            binding.bind_output(name, "cuda", device.index or 0)
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    return run


def _read_inputs(path: Path) -> list[dict[str, Any]]:
    import torch

    return torch.load(path, weights_only=True)


def _status_mib(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def serve(requests: Any, answer: Any) -> None:
    """Answer ``requests`` (an iterator of JSON lines) through ``answer(dict)`` until ``exit``."""
    from aot.errors import AotError

    host: RunnerHost | None = None
    for line in requests:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "exit":
                return
            if op == "setup":
                host = RunnerHost(RunnerSpec(**request))
                answer(host.setup())
            elif op == "warm":
                answer(host.warm(request["shape"], request["calls"], request["memory"]))
            elif op == "time":
                answer({"ms": host.time(request["shape"])})
            elif op == "accuracy":
                answer(host.accuracy())
        except AotError as error:
            answer({"error": str(error), "exit_code": error.exit_code})
        except Exception as error:  # reported to the driver, which decides what it means (a peer that failed)
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            answer({"error": f"{type(error).__name__}: {first_line}", "exit_code": 1})


def _checkpoint_for(plan: Any, peer: str) -> Path:
    """The recipe's pretrained checkpoint, which a peer that converts it needs (aot bench refuses such a peer up front
    for a recipe without one: aot.bench.request)."""
    from aot.bench.peer_groups import without_checkpoint
    from aot.errors import RecipeError

    if plan.model.pretrained is None:
        raise RecipeError(f"peer {without_checkpoint(peer)}")
    return plan.model.pretrained


def _main() -> None:
    from aot.process.forked import die_with_parent

    die_with_parent(os.getppid())
    # The protocol owns the real stdout; whatever a library prints goes to stderr (the driver's log file).
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(reply: dict[str, Any]) -> None:
        protocol.write(json.dumps(reply) + "\n")

    serve(sys.stdin, answer)


if __name__ == "__main__":
    _main()

