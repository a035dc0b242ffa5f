"""Peer baselines for ``aot bench --peers``: what other tools make of the same eager model.

Each peer is built here, from the recipe's eager model, in the process that then
times it (:mod:`aot.bench.worker`), in the same run as aot's artifacts:

- ``ort_torchscript``: ``torch.onnx.export(dynamo=False)``, the TorchScript
  exporter that Optimum's ONNX export is built on, with no further optimisation;
- ``ort_torchscript_fused``: that model through ONNX Runtime's transformer
  optimizer (attention / skip-layernorm / bias-gelu fusions; Optimum's O2);
- ``ort_dynamo``: ``torch.onnx.export(dynamo=True)`` as it comes;
- ``ort_dynamo_fused``: that model through onnxscript's ``optimize_for_ort`` fusions;
- ``ort_quantize_dynamic``: the ``ort_torchscript`` model dynamically quantised to int8 by ONNX
  Runtime's quantiser, as ``optimum-cli onnxruntime quantize --avx512_vnni`` does it;
- ``torch_ao_dynamic``: the eager model's ``nn.Linear`` layers dynamically quantised to int8 by
  ``torch.ao.quantization`` (the int8 peers: :mod:`aot.bench.int8_peers`);
- ``hf_onnx``: transformers' own exporter (``transformers.exporters.OnnxExporter``, 5.24 and later) with
  dynamic shapes and its ONNX Runtime fusions for the CPU (``OnnxConfig(dynamic=True, ort_fusions="cpu")``),
  saved as its ``save_pretrained`` writes it; on an older transformers it fails to build, and says why;
- ``decoder`` (a decoder build's only peers): ``eager_bf16``, onnxruntime-genai's ``ort_genai``
  (:mod:`aot.bench.decoder_peers`) and llama.cpp's ``llama_cpp`` (:mod:`aot.bench.llama_cpp_peer`);
- ``torch_compile_freezing``: ``torch.compile`` with inductor freezing (opt-in:
  it compiles for tens of seconds per shape; the bench reports the first call's time);
- ``cuda`` (a CUDA build's only peers): eager float16 and ``torch.compile``, with and without CUDA graphs
  (:mod:`aot.bench.cuda_peers`).

A peer that fails to build is reported as such, not silently dropped. A peer's ONNX
file is written once into the bench's work directory and reused by the peers built on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aot.bench.cuda_peers import build_cuda_peer
from aot.bench.int8_peers import quantize_onnx_dynamic, quantize_torch_dynamic
from aot.bench.peer_groups import CUDA_PEERS

log = logging.getLogger(__name__)

Runner = Callable[[dict[str, torch.Tensor]], Any]

def _quietly(action: Callable[[], Any]) -> Any:
    from aot.process.quiet import quiet_torch

    with quiet_torch("a peer's export"):
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

        # The exporter puts the module it is given back in its own mode afterwards, and puts its
        # submodules in that mode too: a wrapper left in training mode would leave the eager model there.
        wrapper = Positional(model).train(model.training)
        torch.onnx.export(
            wrapper, tuple(inputs.values()), str(path), dynamo=False, input_names=names,
            dynamic_axes={name: {axis: dim for axis, dim in axes.get(name, {}).items()} for name in names}, opset_version=17,
        )


def _hf_export(model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], path: Path) -> None:
    """transformers' own ONNX exporter, as its documentation shows it, with the CPU fusions.

    Its ``dynamic=True`` marks every axis ``Dim.AUTO``, and torch.export then fixes an axis whose example
    size is 1: the bench's dynamic axes are given as ``dynamic_shapes``, on an example at least 2 long in each.
    """
    try:
        from transformers.exporters import OnnxConfig, OnnxExporter
    except ImportError as error:
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} has no exporters (5.24 and later): {error}") from None
    example = dict(inputs)
    for name, named_axes in axes.items():
        for axis in named_axes:
            if name in example and example[name].shape[axis] == 1:
                example[name] = torch.cat([example[name]] * 2, dim=axis)
    shapes = {name: {axis: torch.export.Dim.AUTO for axis in axes.get(name, {})} for name in example}
    config = OnnxConfig(dynamic=True, dynamic_shapes=shapes, ort_fusions="cpu")
    exported = OnnxExporter().export(model, example, config=config)
    OnnxExporter.save_program(exported.program, path)


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


def session_runner(path: Path, threads: int, spinning: bool = True) -> Runner:
    """An ONNX Runtime session as a user would open it, with ``threads`` intra-op threads.

    ``spinning=False`` when other runners share the process: ORT's idle workers would otherwise
    spin on the cores the next runner needs.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda inputs: session.run(None, {name: inputs[name].numpy() for name in names})


_ONNX_FILES = {
    "ort_torchscript": "torchscript.onnx",
    "ort_torchscript_fused": "torchscript_fused.onnx",
    "ort_dynamo": "dynamo.onnx",
    "ort_dynamo_fused": "dynamo_fused.onnx",
    "ort_quantize_dynamic": "torchscript_int8.onnx",
    "hf_onnx": "hf_onnx.onnx",
}
_BUILT_ON = {"ort_torchscript_fused": "ort_torchscript", "ort_dynamo_fused": "ort_dynamo", "ort_quantize_dynamic": "ort_torchscript"}


def write_peer_onnx(
    peer: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], workdir: Path
) -> Path:
    """The peer's ONNX file in ``workdir``, written (with the file it is built on) unless it is there already."""
    path = workdir / _ONNX_FILES[peer]
    if path.exists():
        return path
    base = _BUILT_ON.get(peer)
    source = write_peer_onnx(base, model, inputs, axes, workdir) if base else None
    steps: dict[str, Callable[[], None]] = {
        "ort_torchscript": lambda: _export(model, inputs, axes, path, dynamo=False),
        "ort_torchscript_fused": lambda: _ort_fuse(source, path, model.config),
        "ort_dynamo": lambda: _export(model, inputs, axes, path, dynamo=True),
        "ort_dynamo_fused": lambda: _onnxscript_fuse(source, path),
        "ort_quantize_dynamic": lambda: quantize_onnx_dynamic(source, path),
        "hf_onnx": lambda: _hf_export(model, inputs, axes, path),
    }
    _quietly(steps[peer])
    return path


def build_peer(
    peer: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], workdir: Path,
    threads: int, spinning: bool = True,
) -> Runner:
    """A runner for ``peer`` (one of :data:`~aot.bench.peer_groups.ALL_PEERS` or :data:`~aot.bench.peer_groups.CUDA_PEERS`); it raises when the peer cannot be built."""
    if peer in CUDA_PEERS:
        return build_cuda_peer(peer, model)
    if peer == "torch_compile_freezing":
        from aot.compat.torch_private import inductor_config

        inductor_config.freezing = True
        compiled = torch.compile(model)
        return lambda inputs: compiled(**inputs)
    if peer == "torch_ao_dynamic":
        quantized = quantize_torch_dynamic(model)
        return lambda inputs: quantized(**inputs)
    workdir.mkdir(parents=True, exist_ok=True)
    return session_runner(write_peer_onnx(peer, model, inputs, axes, workdir), threads, spinning)
