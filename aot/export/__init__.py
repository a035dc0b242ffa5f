"""Deployable artifacts: a GraphModule saved as torch-only code + safetensors, and ONNX.

- :func:`save_graph_module` / :func:`load`: the GraphModule artifact and its aot-side loader;
- :func:`write_onnx` / :func:`optimize_onnx` / :func:`run_onnx`: the ONNX artifact, fused for ONNX Runtime
  (onnxscript's fusions and aot's own rules, :mod:`aot.export.onnx_rules`), and inference;
- :func:`write_aoti_package` / :class:`AotiProcess`: the optional AOTInductor package, and its run in a process
  of its own.

Every writer here gives byte-identical files for the same graph in any process, but the AOTInductor
package's (:mod:`aot.export.aoti_package` says why).
"""

from .aoti_package import AOTI_FILE, AotiCrash, AotiProcess, write_aoti_package
from .graph_module_artifact import load, load_standalone, save_graph_module
from .onnx_export import OnnxArtifact, write_onnx
from .onnx_optimize import optimize_onnx
from .onnx_runtime import release_sessions, run_onnx

__all__ = [
    "AOTI_FILE", "AotiCrash", "AotiProcess", "OnnxArtifact", "load", "load_standalone", "optimize_onnx", "release_sessions",
    "run_onnx", "save_graph_module", "write_aoti_package", "write_onnx",
]
