"""Which modules stay whole (``call_module`` nodes) in a traced graph.

A leaf is never traced through: the graph calls it as one node, and graph
passes match on it (``nn.Linear``, ``nn.Conv2d``, ``nn.BatchNorm2d``...).

Defaults, as in torch.fx: every ``torch.nn`` module except containers, and aot's own
``aot.runtime`` modules (``UpcastLinear``, a linear layer keeping narrow weights, must reach the
passes as the layer it is). On top of that, HF-aware defaults:

- ``transformers.pytorch_utils.Conv1D`` (GPT-2's transposed linear);
- every class whose name ends in ``RMSNorm`` (``LlamaRMSNorm``, ``MistralRMSNorm``...),
  and the T5-family RMS norms (``T5LayerNorm``...): their forwards upcast to
  float32 and cast back depending on the weight's dtype, a branch that must be
  taken at run time for ``gm.to(torch.bfloat16)`` to work.

Users add leaves by class, class name (``"Conv1D"``), dotted class path
(``"transformers.pytorch_utils.Conv1D"``) or module qualified name
(``"encoder.layer.0"``). A dotted string that imports as a class is a class
path; otherwise it is a module path. A bare name matches a class name or a
top-level module name.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

import torch

from aot.errors import TraceError

DEFAULT_LEAF_CLASS_PATHS = ("transformers.pytorch_utils.Conv1D", "aot.runtime.onednn_linear.OneDNNLinear")
DEFAULT_LEAF_CLASS_SUFFIXES = ("RMSNorm",)
DEFAULT_LEAF_CLASS_NAMES = frozenset(
    {"T5LayerNorm", "MT5LayerNorm", "UMT5LayerNorm", "LongT5LayerNorm", "Pix2StructLayerNorm",
     "Pop2PianoLayerNorm", "SwitchTransformersLayerNorm"}
)
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _import_class(path: str) -> type | None:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    value = getattr(module, attr, None)
    return value if isinstance(value, type) else None


class LeafPolicy:
    def __init__(self, leaf_modules: Iterable[type | str] = (), use_defaults: bool = True):
        self.classes: set[type] = set()
        self.names: set[str] = set()
        self.paths: set[str] = set()
        self.use_defaults = use_defaults
        self.specs: list[str] = []
        for spec in leaf_modules:
            self.add(spec)
        if use_defaults:
            for path in DEFAULT_LEAF_CLASS_PATHS:
                cls = _import_class(path)
                if cls is not None:
                    self.classes.add(cls)

    def add(self, spec: type | str) -> None:
        if isinstance(spec, type):
            if not issubclass(spec, torch.nn.Module):
                raise TraceError(f"leaf_modules entry {spec.__qualname__} is not an nn.Module class")
            self.classes.add(spec)
            self.specs.append(f"{spec.__module__}.{spec.__qualname__}")
        elif isinstance(spec, str) and spec:
            cls = _import_class(spec) if "." in spec else None
            if cls is not None:
                self.classes.add(cls)
            elif "." in spec:
                self.paths.add(spec)
            else:
                self.names.add(spec)
            self.specs.append(spec)
        else:
            raise TraceError(f"leaf_modules entry {spec!r} is neither a module class nor a name")

    def is_leaf(self, module: torch.nn.Module, qualified_name: str) -> bool:
        if not qualified_name:
            return False
        cls = type(module)
        if qualified_name in self.paths or qualified_name in self.names:
            return True
        if cls.__name__ in self.names or any(issubclass(cls, leaf) for leaf in self.classes):
            return True
        if not self.use_defaults or isinstance(module, _CONTAINERS):
            return False
        if cls.__module__.startswith(("torch.nn", "torch.ao.nn", "aot.runtime.")):
            return True
        return cls.__name__.endswith(DEFAULT_LEAF_CLASS_SUFFIXES) or cls.__name__ in DEFAULT_LEAF_CLASS_NAMES

    def check_paths(self, root: torch.nn.Module) -> None:
        """A module path that names no submodule is a typo: say so instead of ignoring it."""
        if not self.paths:
            return
        known = {name for name, _ in root.named_modules()}
        for path in sorted(self.paths - known):
            raise TraceError(f"leaf_modules entry '{path}' is neither an importable class nor a submodule of {type(root).__name__}")
