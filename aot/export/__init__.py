"""Deployable artifacts, one unit per kind (:mod:`aot.export.kinds` is their registry):

- the saved GraphModule (:mod:`aot.export.graph_module_artifact`): torch-only ``module.py`` + safetensors;
  :func:`save_graph_module`, :func:`load_standalone` (``module.py``'s own ``load``) and :func:`load` (the graph back);
- ONNX (:mod:`aot.export.onnx_artifact`): :func:`write_onnx` (a decoder's with its onnxruntime-genai config),
  fused for ONNX Runtime by :func:`optimize_onnx`
  (onnxscript's fusions and aot's own rules, :mod:`aot.export.onnx_rules`), run by :func:`run_onnx`;
- a compiled package, optional (its unit is registered in :mod:`aot.export.kinds`).

Every writer here gives byte-identical files for the same graph in any process, but the compiled package's
(its module says why). The names below import their module on first use: ``aot.export.kinds`` stays light, so the
build imports the export stack beside the weights' load (:mod:`aot.process.imports_beside`), not before it.
"""

import importlib

_NAMES = {
    "load": "graph_module_artifact", "load_standalone": "graph_module_artifact", "save_graph_module": "graph_module_artifact",
    "OnnxArtifact": "onnx_export", "write_onnx": "onnx_artifact", "optimize_onnx": "onnx_optimize",
    "release_sessions": "onnx_runtime", "run_onnx": "onnx_runtime",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'aot.export' has no attribute '{name}'")
    return getattr(importlib.import_module(f"aot.export.{_NAMES[name]}"), name)
