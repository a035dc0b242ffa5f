"""Model capture: Hugging Face and plain PyTorch models to torch.fx GraphModules.

- ``symbolic_trace``: the ``fx`` frontend, a module-level graph (``nn.Linear``,
  ``nn.Conv2d``... stay ``call_module`` nodes) traced with fake-valued proxies;
- ``export_trace``: the ``export`` frontend, an ATen-level graph from ``torch.export``.

Both return a GraphModule callable as ``gm(**inputs)`` with
``gm.meta["trace_report"]`` and ``node.meta["scope"]`` on every node, and raise
``aot.errors.TraceError``.
"""

from .export_trace import export_trace
from .model_state import disable_hooked_forward
from .scope import Scope, ScopeContextManager
from .symbolic_trace import symbolic_trace
from .tracer import HFTracer


__all__ = ["HFTracer", "Scope", "ScopeContextManager", "disable_hooked_forward", "export_trace", "symbolic_trace"]
