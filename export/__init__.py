"""Deployable artifacts: a GraphModule saved as torch-only code + safetensors, and ONNX.

- :func:`save_graph_module` / :func:`load`: the GraphModule artifact and its aot-side loader;
- :func:`export_onnx` / :func:`run_onnx`: the ONNX artifact and ONNX Runtime inference.

Every writer here gives byte-identical files for the same graph in any process.
"""

from .graph_module_artifact import load, load_standalone, save_graph_module
from .onnx_export import export_onnx
from .onnx_optimize import optimize_onnx
from .onnx_runtime import release_sessions, run_onnx

__all__ = ["export_onnx", "load", "load_standalone", "optimize_onnx", "release_sessions", "run_onnx", "save_graph_module"]
