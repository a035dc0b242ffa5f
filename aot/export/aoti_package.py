"""The AOTInductor package: the graph compiled ahead of time by torch's Inductor into one ``.pt2`` file.

::

    graph (after the recipe's passes)
      --torch.export, the recipe's dynamic dims bounded as it says-->  ExportedProgram
      --torch._inductor.aoti_compile_and_package-->                   aoti/model.pt2
                                                  (generated C++ or Triton kernels compiled into a
                                                   shared library, its wrapper, and the weights)

Users load it with torch alone: ``torch._inductor.aoti_load_package(path)(**inputs)`` returns
``{output name: tensor}``, named as every aot artifact names its outputs
(:func:`aot.tracing.outputs.flatten_outputs`). The graph is exported behind a wrapper that returns that dict,
so the package's output spec holds no transformers type: torch unflattens it without transformers.

What the package is not (the manifest's ``aoti`` says the first two):

- byte-reproducible: torch writes a random ``serialization_id`` into every archive, and Inductor
  appends its compile commands to the generated C++ sources or not, depending on what its cache
  already held (measured with ``benchmarks/same_bytes.py``: two builds of ``recipes/bert_aoti.yaml``
  on one machine differ in those three files; the compiled library and the weights were the same);
- portable: on the CPU the C++ compiler targets the build machine's own processor
  (``-march=native``), on CUDA the build GPU's architecture;
- faster than eager on the CPU: with the recipe's dynamic batch and sequence, Inductor keeps ATen's
  ``addmm`` for the linear layers (also with ``freezing`` and ``max_autotune``'s C++ GEMMs, tried on
  torch 2.13), so BERT-base runs at eager's speed, where the saved GraphModule's prepacked oneDNN
  GEMMs run 2.3x faster (docs/performance.md).

It is loaded in a process of its own (:class:`AotiProcess`): loading it opens compiled code, and
a crash there must fail the build with a message, not end it. Seen with the GPU image's torch 2.11.0+cu130 on
an H100 and an H200, on every CUDA package: a segmentation fault in the ``std::regex`` that torch's AOTI runtime
header builds in ``AOTInductorModel``'s constructor (``benchmarks/aoti_load_probe.py`` found the frame).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import pickle
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.fx

from aot.directory.manifest import cpu_model
from aot.compat.torch_private import aoti_compile_and_package
from aot.errors import ExportError, first_line
from aot.process.quiet import quiet_torch
from aot.tracing.outputs import flatten_outputs

from .export_shapes import dynamic_shapes_of, ordered_inputs
from .kinds import ArtifactKind, OpenOptions, WriteContext

logger = logging.getLogger(__name__)

AOTI_FILE = "aoti/model.pt2"  # where a build directory holds the package
_CHILD = Path(__file__).with_name("aoti_child.py")
# What the manifest says of the package's bytes; benchmarks/same_bytes.py's compare measured it.
NOT_REPRODUCIBLE = ("torch writes a random serialization_id into every .pt2 archive, and Inductor appends its compile "
                    "commands to the generated C++ sources or not, depending on what its cache already held")


def write_aoti_package(
    gm: torch.fx.GraphModule,
    example_inputs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, str]],
    dim_ranges: dict[str, tuple[int | None, int | None]] | None,
    path: Path,
) -> dict[str, Any]:
    """Compile ``gm`` into ``path``; returns what the manifest records of it (see the module docstring)."""
    inputs = ordered_inputs(gm, example_inputs)
    shapes = dynamic_shapes_of(inputs, dynamic_dims, dim_ranges, refinable=True) if dynamic_dims else None
    named = _with_named_outputs(gm, list(inputs))
    try:
        with quiet_torch("torch.export"):
            program = torch.export.export(named, (), kwargs=inputs, dynamic_shapes=shapes, strict=False)
    except Exception as error:
        raise ExportError(f"torch.export rejects the graph for {path.name}: {type(error).__name__}: {first_line(error)}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    device = next(iter(inputs.values())).device
    try:
        with quiet_torch("AOTInductor"):
            aoti_compile_and_package(program, package_path=str(path))
    except Exception as error:
        path.unlink(missing_ok=True)
        raise ExportError(f"{path.name}: AOTInductor cannot compile the graph: {type(error).__name__}: {first_line(error)}") from None
    logger.info("compiled %s for %s", path, device)
    return {"file": AOTI_FILE, "compiled_for": _compiled_for(device), "inputs": list(inputs),
            "byte_reproducible": False, "why_not_reproducible": NOT_REPRODUCIBLE}


def _with_named_outputs(gm: torch.fx.GraphModule, names: list[str]) -> torch.nn.Module:
    """``gm`` behind a module whose ``forward(<the graph's inputs>)`` returns ``flatten_outputs(gm(...))``.

    torch.export binds keyword inputs to the forward's signature, so the wrapper's forward is given
    the graph's own parameter names (``__signature__``) rather than a bare ``**inputs``.
    """

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        return flatten_outputs(self.graph_module(**dict(zip(names, args)), **kwargs))

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ["self", *names]]
    forward.__signature__ = inspect.Signature(parameters)
    wrapper = type("NamedOutputs", (torch.nn.Module,), {"forward": forward})()
    wrapper.graph_module = gm
    return wrapper


def _compiled_for(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda: {torch.cuda.get_device_name(device)} (sm_{major}{minor}), CUDA {torch.version.cuda}"
    return f"cpu: {platform.machine()} {cpu_model()} (-march=native)"


class AotiProcess:
    """An AOTInductor package loaded and run in a child process of its own (:mod:`aot.export.aoti_child`).

    ``with AotiProcess(path, device) as package: package.run(inputs)`` returns the package's
    ``{output name: tensor}`` on the CPU. A child that dies (a crash while loading or running) is
    reported as :class:`AotiCrash`, naming the signal and the child's last line on stderr.
    """

    def __init__(self, path: Path, device: str | torch.device = "cpu"):
        self.path = Path(path)
        self.device = str(device)
        self._stderr = tempfile.TemporaryFile()
        self._child = subprocess.Popen(
            [sys.executable, str(_CHILD), str(self.path), self.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )
        try:
            self.load_s = self._reply("load")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> AotiProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        request = {name: value.detach().cpu() if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}
        try:
            pickle.dump(request, self._child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._child.stdin.flush()
        except BrokenPipeError:
            raise self._crash("run") from None
        return self._reply("run")

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.stdin.close()
            try:
                self._child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        self._stderr.close()

    def _reply(self, doing: str) -> Any:
        try:
            status, value = pickle.load(self._child.stdout)
        except (EOFError, pickle.UnpicklingError):
            raise self._crash(doing) from None
        if status == "error":
            raise (ExportError(f"{self.path.name}: {value}") if doing == "load" else RuntimeError(value))
        return value

    def _crash(self, doing: str) -> AotiCrash:
        code = self._child.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace")
        said = _last_words(stderr)
        # The error is one line; the child's own account (its Python stack, what torch wrote before it) goes to the log.
        logger.warning("%s: the child's stderr ended with:\n%s", self.path.name, "\n".join(stderr.splitlines()[-60:]))
        return AotiCrash(f"{self.path.name}: the process that {'loads' if doing == 'load' else 'runs'} it died ({how}){said}")


def _last_words(stderr: str) -> str:
    """What a dead child's stderr says of its end: faulthandler's fault and innermost frame, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    faults = [index for index, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if faults:
        frames = [line for line in lines[faults[-1]:] if line.startswith("File ")]
        return f": {lines[faults[-1]]}" + (f", in {frames[0]}" if frames else "")
    return f": {lines[-1]}" if lines else ""


class AotiCrash(ExportError):
    """The process running an AOTInductor package died."""


class AotiRunnable:
    """``aoti/model.pt2`` loaded in this process by ``torch._inductor.aoti_load_package``, as users load it.

    ``package``: the manifest's ``aoti`` entry: the inputs the package takes, and the device it was compiled for
    (a CUDA package takes its inputs there; its outputs come back to the CPU).
    """

    runtime = "aoti"

    def __init__(self, path: Path, package: dict[str, Any]):
        from aot.compat.torch_private import aoti_load_package

        self.run = aoti_load_package(str(path))
        self.input_names = list(package["inputs"])
        self.device = "cuda" if package["compiled_for"].startswith("cuda") else "cpu"

    @torch.no_grad()
    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = self.run(**{name: inputs[name].to(self.device) for name in self.input_names})
        return {name: value.cpu() for name, value in outputs.items()}

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
        raise NotImplementedError("the AOTInductor package has no generate(): use runtime 'onnx' or 'torch'")


class AotiKind(ArtifactKind):
    """The AOTInductor package (``export.aoti``): written by :func:`write_aoti_package`, checked in a process of its
    own (:class:`AotiProcess`), opened in the caller's by torch's own loader (:class:`AotiRunnable`)."""

    title = "AOTInductor package"
    name = "aoti"
    fixed_threads = "its threads were fixed when Inductor compiled it"  # the kernels' OpenMP regions name their count
    runtime = "aoti"
    main_file = AOTI_FILE
    runs_code = True  # a compiled shared library
    generates = False
    manifest_key = "aoti"

    def write(self, graph: torch.fx.GraphModule, context: WriteContext) -> dict[str, Any]:
        return write_aoti_package(graph, context.example_inputs, context.dynamic_dims, context.dim_ranges, context.directory / AOTI_FILE)

    def manifest_section(self, written: Any) -> dict[str, Any] | None:
        return written

    def open(self, directory: Path, options: OpenOptions) -> AotiRunnable:
        return AotiRunnable(directory / AOTI_FILE, options.manifest["aoti"])

    @contextlib.contextmanager
    def checked_runner(self, directory: Path, options: OpenOptions, input_names: dict[str, str]):
        with AotiProcess(directory / AOTI_FILE, options.device) as package:
            yield package.run, package.run, f"{AOTI_FILE} in torch._inductor.aoti_load_package, its own process"


AOTI = AotiKind()

