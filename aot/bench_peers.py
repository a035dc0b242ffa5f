"""Peer baselines for ``aot bench --peers``: what other tools make of the same eager model.

Each peer is built here, from the recipe's eager model, so that it is timed in
the same process and the same run as aot's artifacts:

- ``ort_torchscript``: ``torch.onnx.export(dynamo=False)``, the TorchScript
  exporter that Optimum's ONNX export is built on, with no further optimisation;
- ``ort_torchscript_fused``: that model through ONNX Runtime's transformer
  optimizer (attention / skip-layernorm / bias-gelu fusions; Optimum's O2);
- ``ort_dynamo``: ``torch.onnx.export(dynamo=True)`` as it comes;
- ``ort_dynamo_fused``: that model through onnxscript's ``optimize_for_ort`` fusions;
- ``torch_compile_freezing``: ``torch.compile`` with inductor freezing (opt-in:
  it compiles for tens of seconds per shape).

A peer that fails to build is reported as such, not silently dropped.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ONNX_PEERS = ("ort_torchscript", "ort_torchscript_fused", "ort_dynamo", "ort_dynamo_fused")
ALL_PEERS = ONNX_PEERS + ("torch_compile_freezing",)

Runner = Callable[[dict[str, torch.Tensor]], Any]


def _quietly(action: Callable[[], Any]) -> Any:
    from aot.export.onnx_export import quiet_exporter_logs

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), quiet_exporter_logs():
        warnings.simplefilter("ignore")
        return action()


def _export(model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], path: Path, dynamo: bool) -> None:
    names = list(inputs)
    if dynamo:
        shapes = {name: {axis: torch.export.Dim.AUTO for axis in axes.get(name, {})} for name in names}
        program = torch.onnx.export(model, (), kwargs=dict(inputs), dynamo=True, dynamic_shapes=shapes, opset_version=18)
        program.save(str(path))
    else:

        class Positional(torch.nn.Module):
            def __init__(self, inner: torch.nn.Module):
                super().__init__()
                self.inner = inner

            def forward(self, *args: torch.Tensor) -> Any:
                return self.inner(**dict(zip(names, args)), return_dict=False)

        torch.onnx.export(
            Positional(model), tuple(inputs.values()), str(path), dynamo=False, input_names=names,
            dynamic_axes={name: {axis: dim for axis, dim in axes.get(name, {}).items()} for name in names}, opset_version=17,
        )


def _ort_fuse(source: Path, target: Path, config: Any) -> None:
    from onnxruntime.transformers import optimizer

    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    optimized = optimizer.optimize_model(str(source), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    optimized.save_model_to_file(str(target))


def _onnxscript_fuse(source: Path, target: Path) -> None:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(source))
    fused, _counts = optimize_for_ort(model)
    ir.save(fused, str(target))


def _session_runner(path: Path, threads: int) -> Runner:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # fair interleaving, as in aot.bench
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda inputs: session.run(None, {name: inputs[name].numpy() for name in names})


def build_peers(
    wanted: tuple[str, ...], model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], workdir: Path, threads: int
) -> tuple[dict[str, Runner], dict[str, str]]:
    """Runners for the ``wanted`` peers, and ``{peer: reason}`` for those that could not be built."""
    runners: dict[str, Runner] = {}
    failures: dict[str, str] = {}
    workdir.mkdir(parents=True, exist_ok=True)
    paths = {
        "ort_torchscript": workdir / "torchscript.onnx",
        "ort_torchscript_fused": workdir / "torchscript_fused.onnx",
        "ort_dynamo": workdir / "dynamo.onnx",
        "ort_dynamo_fused": workdir / "dynamo_fused.onnx",
    }
    steps: dict[str, Callable[[], None]] = {
        "ort_torchscript": lambda: _export(model, inputs, axes, paths["ort_torchscript"], dynamo=False),
        "ort_torchscript_fused": lambda: _ort_fuse(paths["ort_torchscript"], paths["ort_torchscript_fused"], model.config),
        "ort_dynamo": lambda: _export(model, inputs, axes, paths["ort_dynamo"], dynamo=True),
        "ort_dynamo_fused": lambda: _onnxscript_fuse(paths["ort_dynamo"], paths["ort_dynamo_fused"]),
    }
    prerequisite = {"ort_torchscript_fused": "ort_torchscript", "ort_dynamo_fused": "ort_dynamo"}
    for peer in ONNX_PEERS:
        needed = peer in wanted or any(prerequisite.get(w) == peer for w in wanted)
        if not needed:
            continue
        if prerequisite.get(peer) in failures:
            failures[peer] = f"needs {prerequisite[peer]}, which failed"
            continue
        try:
            if not paths[peer].exists():
                _quietly(steps[peer])
            if peer in wanted:
                runners[peer] = _session_runner(paths[peer], threads)
        except Exception as error:  # a peer's failure is a finding to report, not a reason to stop the bench
            failures[peer] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning("peer %s could not be built: %s", peer, failures[peer])
    if "torch_compile_freezing" in wanted:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        compiled = torch.compile(model)
        runners["torch_compile_freezing"] = lambda inputs: compiled(**inputs)
    return runners, failures
