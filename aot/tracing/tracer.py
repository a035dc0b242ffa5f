"""HFTracer: a torch.fx Tracer whose proxies carry fake values.

Every node gets its *fake value* as it is created: the op runs on the fake
values of its arguments under a ``FakeTensorMode`` (no real compute, no real
memory). With those values the model's Python code can ask for ``len()``,
``bool()``, ``dim()`` and shapes, while the ops stay in the graph:

    x.shape[1] > 1      ->  getattr(x, "shape") -> getitem -> gt   (nodes)
    if <that>:          ->  resolved to True from the fake value, recorded as a decision

Shapes, dtypes and devices stay symbolic (they are graph nodes read from the
tensors at run time), so a graph traced at one shape runs at others, and
``gm.to(torch.bfloat16)`` / ``gm.to(device)`` work.

An op whose output *size* depends on data (``nonzero``, ``unique_consecutive``, boolean
indexing) gets an unbacked size symbol from the fake mode's ``ShapeEnv``, as under
torch.export: the op stays in the graph, the graph follows the data at run time, and only
a Python decision on such a size (``if x.nonzero().shape[0] > 1``) fails, naming the line.

Tracer hooks used here:

- ``create_proxy``: compute the fake value of each new node (``node.meta["val"]``
  for tensor values); an op that cannot run on fake values raises a TraceError at
  the user's line;
- ``create_node``: ``node.meta["scope"] = Scope(module_path, module_type)``;
- ``call_module`` / ``is_leaf_module``: scope tracking and the leaf policy;
- ``getattr`` / ``create_arg``: parameters and buffers become ``get_attr`` nodes by
  identity; other tensors become constants kept by the tracer (never set on the
  model) and recorded as baked constants;
- ``create_args_for_root``: placeholders named after ``input_names`` and a
  generated root function that calls the model with them as keyword arguments.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.node import Node, map_arg

from aot.errors import TraceError

from .fake_proxy import FakeProxy
from .leaf_policy import LeafPolicy
from .scope import Scope, ScopeContextManager, qualified_type_name
from .source_location import SourceLocation, user_location
from .torch_functions import LEAF_FUNCTIONS, check_condition

# A traced check has no users, but it is the point of its node: dead-code elimination keeps it.
torch.fx.node.has_side_effect(check_condition)

UNKNOWN = object()  # fake value of a node whose inputs had no example values

_DATA_DEPENDENT_HINT = (
    "make the module that does this a leaf (leaf_modules=[...]), wrap the function that does it "
    "(autowrap_functions=['pkg.module:function']), or use the export frontend (trace: export)"
)


def _contains_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_tensor(item) for item in value)
    return False


def _describe(value: Any) -> Any:
    """A JSON-serialisable rendering of a concrete value a decision resolved to."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list, torch.Size)):
        return [_describe(item) for item in value]
    return str(value)


class HFTracer(torch.fx.Tracer):
    """torch.fx Tracer for Hugging Face (and plain) models; see the module docstring.

    ``leaf_modules``: extra leaves (classes, class names, dotted class paths or
    module qualified names); ``autowrap_functions``: functions recorded as single
    ``call_function`` nodes wherever a traced module's globals refer to them.
    """

    proxy_buffer_attributes = True

    def __init__(
        self,
        leaf_modules: Iterable[type | str] = (),
        autowrap_functions: Iterable[Callable] = (),
        use_default_leaves: bool = True,
    ):
        # The leaf functions are autowrapped too, so that fx can re-trace a saved GraphModule's code.
        super().__init__(autowrap_modules=(math,), autowrap_functions=tuple(autowrap_functions) + LEAF_FUNCTIONS)
        self.leaf_policy = LeafPolicy(leaf_modules, use_defaults=use_default_leaves)
        # torch's fake tensors and symbolic shapes are imported by the tracer that uses them, not with aot.tracing: they
        # (and sympy) take a second, which a command that never traces (a build restored from the cache) would pay.
        from aot.compat.torch_private import FakeTensorMode, ShapeEnv

        # The shape environment gives an op whose output size depends on data (unique_consecutive, boolean
        # indexing) an unbacked size symbol, as torch.export does; Python decisions on such a size still fail.
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        self.current_scope = Scope("", "")
        self.decisions: collections.Counter = collections.Counter()
        self.baked_constants: list[dict] = []
        self.notes: list[str] = []
        self.constants: dict[str, torch.Tensor] = {}
        # Stateless modules the model creates inside forward (nn.ReLU(), CrossEntropyLoss()), by the
        # root-level name the graph calls them under; held here, so their ids stay unique while tracing.
        self.inserted_modules: dict[str, torch.nn.Module] = {}
        self._traced_through: set[int] = set()  # inserted modules whose settings are traced values
        self._fake_values: dict[Node, Any] = {}
        self._fake_attrs: dict[str, Any] = {}
        self._evaluating = False
        self._tensor_names: dict[int, str] = {}
        self._module_paths: dict[int, str] = {}
        self._input_names: list[str] | None = None
        self._forward_keywords: dict[str, str] = {}
        self._example_inputs: Mapping[str, Any] = {}
        self._static_kwargs: dict[str, Any] = {}
        self._output_adapter: Callable[[Any], Any] = lambda value: value

    # ------------------------------------------------------------------ entry
    def trace_model(
        self,
        model: torch.nn.Module,
        input_names: Sequence[str] | None,
        example_inputs: Mapping[str, Any] | None,
        static_kwargs: Mapping[str, Any] | None = None,
        concrete_args: dict[str, Any] | None = None,
        output_adapter: Callable[[Any], Any] | None = None,
        forward_keywords: Mapping[str, str] | None = None,
    ) -> torch.fx.Graph:
        """Trace ``model``; with ``input_names`` the graph's placeholders are exactly those names.

        ``forward_keywords``: ``{input name: the forward's keyword}`` where they differ (:mod:`aot.tracing.input_names`).
        """
        self._input_names = list(input_names) if input_names is not None else None
        self._forward_keywords = dict(forward_keywords or {})
        self._example_inputs = dict(example_inputs or {})
        self._static_kwargs = dict(static_kwargs or {})
        if output_adapter is not None:
            self._output_adapter = output_adapter
        self.leaf_policy.check_paths(model)
        graph = self.trace(model, concrete_args if self._input_names is None else None)
        for node in graph.nodes:
            self.fake_value(node)
        return graph

    def trace(self, root, concrete_args=None) -> torch.fx.Graph:
        """``torch.fx.Tracer.trace`` with this tracer's patches; also used by fx to re-trace saved GraphModules."""
        from .trace_patches import tracing_patches

        module = root if isinstance(root, torch.nn.Module) else None
        self.current_scope = Scope("", qualified_type_name(module) if module is not None else "")
        self._tensor_names = {}
        self._module_paths = {}
        if module is not None:
            for name, tensor in module.named_buffers():
                self._tensor_names.setdefault(id(tensor), name)
            for name, tensor in module.named_parameters():
                self._tensor_names.setdefault(id(tensor), name)
            self._module_paths = {id(sub): name for name, sub in module.named_modules()}
        self.inserted_modules, self._traced_through = {}, set()
        with tracing_patches(self):
            return super().trace(root, concrete_args)

    # ------------------------------------------------------------ root inputs
    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        if self._input_names is None:
            fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
            if self._example_inputs:
                for arg in args:
                    if isinstance(arg, torch.fx.Proxy) and arg.node.op == "placeholder":
                        self._set_placeholder_fake(arg.node, arg.node.target)
            return fn, args
        placeholders = []
        for name in self._input_names:
            proxy = self.create_proxy("placeholder", name, (), {})
            self._set_placeholder_fake(proxy.node, name)
            placeholders.append(proxy)
        model, static_kwargs, adapt = self.root, self._static_kwargs, self._output_adapter
        keywords = [self._forward_keywords.get(name, name) for name in self._input_names]

        def traced_forward(*inputs):
            return adapt(model(**dict(zip(keywords, inputs)), **static_kwargs))

        return traced_forward, placeholders

    def _set_placeholder_fake(self, node: Node, name: str) -> None:
        if name not in self._example_inputs:
            self._fake_values[node] = UNKNOWN
            return
        value = self._example_inputs[name]
        if isinstance(value, torch.Tensor):
            value = self.fake_mode.from_tensor(value, static_shapes=True)
            node.meta["val"] = value
        self._fake_values[node] = value

    # ------------------------------------------------------------ node hooks
    def proxy(self, node: Node) -> FakeProxy:
        return FakeProxy(node, self)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        node.meta["scope"] = self.current_scope
        return node

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if kind not in ("placeholder", "output"):
            self.fake_value(proxy.node)
        return proxy

    def create_arg(self, a: Any):
        if isinstance(a, torch.Tensor) and not isinstance(a, torch.fx.Proxy):
            name = self._tensor_names.get(id(a)) or self.tensor_attrs.get(a)
            if name is None:
                name = self._add_constant(a)
            return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)

    def _add_constant(self, tensor: torch.Tensor) -> str:
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = tensor
        self._tensor_names[id(tensor)] = name
        location = user_location()
        self.baked_constants.append(
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype),
                "device": str(tensor.device),
                "file": location.short_file(),
                "line": location.line,
                "expression": location.expression,
            }
        )
        return name

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._evaluating or not isinstance(attr_val, torch.Tensor):
            return attr_val
        name = self._tensor_names.get(id(attr_val))
        if name is None:
            return attr_val
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]

    # ---------------------------------------------------------------- modules
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return id(m) not in self._traced_through and self.leaf_policy.is_leaf(m, module_qualified_name)

    def path_of_module(self, mod: torch.nn.Module) -> str:
        path = self._module_paths.get(id(mod))
        if path is None:
            path = self._insert_stateless_module(mod)
        return path

    def _insert_stateless_module(self, mod: torch.nn.Module) -> str:
        """A module made inside forward joins the graph's module tree when it holds no state (as HFTracer did).

        One holding parameters or buffers would be created anew, with new weights, at every call:
        it cannot be part of a graph, and the model must create it in ``__init__``.
        """
        held = next(iter(mod.parameters()), None) is not None or next(iter(mod.buffers()), None) is not None
        if held:
            location = user_location()
            raise TraceError(
                f"module {type(mod).__name__} is created inside forward with parameters or buffers, at "
                f"{location.short_file()}:{location.line}: create it in __init__ so the graph can hold its weights"
            )
        name = f"_inserted_{type(mod).__name__.lower()}_{len(self.inserted_modules)}"
        self.inserted_modules[name] = mod
        self._module_paths[id(mod)] = name
        if any(isinstance(value, torch.fx.Proxy) for value in vars(mod).values()):
            # Built from traced values (CrossEntropyLoss(ignore_index=logits.size(1))): as a called module it
            # would keep a proxy as its setting, so its forward is traced instead, the values as graph inputs.
            self._traced_through.add(id(mod))
            self.notes.append(f"{type(mod).__name__} created inside forward from traced values is traced through")
        else:
            self.notes.append(f"{type(mod).__name__} created inside forward is called as the stateless submodule '{name}'")
        return name

    def submodule(self, target: str) -> torch.nn.Module:
        """A module the graph calls: the model's own, or one inserted while tracing."""
        return self.inserted_modules[target] if target in self.inserted_modules else self.root.get_submodule(target)

    def call_module(self, m, forward, args, kwargs):
        if self._evaluating:
            return forward(*args, **kwargs)
        with ScopeContextManager(self, m, self.path_of_module(m)):
            return super().call_module(m, forward, args, kwargs)

    # ------------------------------------------------------------ fake values
    def is_python_value(self, node: Node) -> bool:
        """True when the node computes a known non-tensor value (a size, a dtype...)."""
        value = self._fake_values.get(node, UNKNOWN)
        return value is not UNKNOWN and not _contains_tensor(value)

    def fake_value(self, node: Node) -> Any:
        value = self._fake_values.get(node, None)
        if value is None and node not in self._fake_values:
            value = self._compute_fake(node)
            self._fake_values[node] = value
            if value is not UNKNOWN and _contains_tensor(value):
                node.meta["val"] = value
        return value

    def _compute_fake(self, node: Node) -> Any:
        if node.op in ("placeholder", "output"):
            return UNKNOWN
        if node.op == "get_attr":
            return self._fake_attr(node.target)
        unknown = False

        def lookup(arg: Node) -> Any:
            nonlocal unknown
            value = self.fake_value(arg)
            unknown = unknown or value is UNKNOWN
            return value

        args = map_arg(node.args, lookup)
        kwargs = map_arg(node.kwargs, lookup)
        if unknown:
            return UNKNOWN
        try:
            with self.evaluating():
                if node.op == "call_function":
                    return node.target(*args, **kwargs)
                if node.op == "call_method":
                    return getattr(args[0], node.target)(*args[1:], **kwargs)
                if node.op == "call_module":
                    return self.submodule(node.target).forward(*args, **kwargs)
        except TraceError:
            raise
        except Exception as error:  # the op cannot run on fake values: name the user's line
            if node.op == "call_module":
                value = self._leaf_value_from_zeros(node, args, kwargs)
                if value is not UNKNOWN:
                    return value
            raise self._evaluation_error(node, error) from error
        return UNKNOWN

    def _leaf_value_from_zeros(self, node: Node, args: Any, kwargs: Any) -> Any:
        """Fake value of a leaf whose forward needs real data: run a copy of it on zeros of the right shapes.

        Only the output's shape and dtype are used; the copy keeps the model's own
        state (running statistics...) untouched.
        """

        def real(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
            return value

        try:
            module = copy.deepcopy(self.submodule(node.target))
            previous, self._evaluating = self._evaluating, True
            try:
                with torch.no_grad():
                    output = module(*torch.fx.node.map_aggregate(args, real), **torch.fx.node.map_aggregate(kwargs, real))
            finally:
                self._evaluating = previous
            fake = torch.fx.node.map_aggregate(
                output, lambda v: self.fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
            )
        except Exception:  # noqa: BLE001 - the caller reports the original error
            return UNKNOWN
        self.note(f"the output shape of leaf '{node.target}' was taken from running it on zeros (its forward needs data)")
        return fake

    @contextlib.contextmanager
    def evaluating(self):
        """Run ops on fake values: module calls and attribute reads pass straight through."""
        previous = self._evaluating
        self._evaluating = True
        try:
            # No autograd history on fake values: node.meta["val"] would otherwise keep the eager
            # model's parameters alive (and so double the build's memory) as long as the graph lives.
            with self.fake_mode, torch.no_grad():
                yield
        finally:
            self._evaluating = previous

    def _fake_attr(self, target: str) -> Any:
        if target not in self._fake_attrs:
            value = self.constants.get(target)
            if value is None:
                previous, self._evaluating = self._evaluating, True  # read the attribute, do not trace the read
                try:
                    value = self.root
                    for atom in target.split("."):
                        value = getattr(value, atom)
                finally:
                    self._evaluating = previous
            if isinstance(value, torch.Tensor):
                value = self.fake_mode.from_tensor(value, static_shapes=True)
            self._fake_attrs[target] = value
        return self._fake_attrs[target]

    def _evaluation_error(self, node: Node, error: Exception) -> TraceError:
        from aot.compat.torch_private import DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode

        location = user_location()
        reason = " ".join(str(error).split())[:300]
        data_dependent = isinstance(
            error,
            (
                DataDependentOutputException,
                DynamicOutputShapeException,
                GuardOnDataDependentSymNode,
            ),
        )
        what = "data-dependent operation" if data_dependent else "operation that cannot be traced"
        return TraceError(
            f"{what} at {location} (module '{self.current_scope.module_path}' "
            f"{self.current_scope.module_type}, node {node.format_node()[:120]}): "
            f"{type(error).__name__}: {reason}; {_DATA_DEPENDENT_HINT}"
        )

    # -------------------------------------------------- Python-level decisions
    def static_attribute(self, proxy: FakeProxy, name: str) -> Any:
        value = self.fake_value(proxy.node)
        if isinstance(value, torch.Tensor):
            return getattr(value, name)
        return None

    def concretize(self, proxy: FakeProxy, kind: str, item: Any = None) -> Any:
        from aot.compat.torch_private import GuardOnDataDependentSymNode

        value = self.fake_value(proxy.node)
        location = user_location()
        if value is UNKNOWN:
            raise TraceError(
                f"symbolically traced value used in Python control flow ({kind}) at {location}; "
                f"pass dummy_inputs so the tracer knows example values, or {_DATA_DEPENDENT_HINT}"
            )
        if isinstance(value, torch.Tensor) and kind not in ("len",):
            raise self._control_flow_error(location, f"the {kind}() of a tensor's values")
        try:
            result = self._concrete(value, kind, item)
        except GuardOnDataDependentSymNode as error:
            raise self._control_flow_error(location, f"the {kind}() of a size that depends on tensor values ({error.cond})") from None
        if kind == "len" and not isinstance(value, torch.Tensor):
            return result  # the length of a tuple or Size is the rank: structure, not a decision
        self.record_decision(location, kind, result)
        return result

    def _control_flow_error(self, location: SourceLocation, needed: str) -> TraceError:
        return TraceError(
            f"data-dependent control flow at {location} (module '{self.current_scope.module_path}' "
            f"{self.current_scope.module_type}): Python needs {needed}; {_DATA_DEPENDENT_HINT}"
        )

    def _concrete(self, value: Any, kind: str, item: Any) -> Any:
        if kind == "bool":
            return bool(value)
        if kind == "len":
            return len(value)
        if kind in ("index", "int"):
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "contains":
            if isinstance(item, torch.fx.Proxy):
                item = self.concretize(item, "index" if isinstance(self.fake_value(item.node), int) else "bool")
            return item in value
        raise AssertionError(kind)

    def record_decision(self, location: SourceLocation, kind: str, value: Any) -> None:
        self.decisions[(location.short_file(), location.line, location.expression, kind, json.dumps(_describe(value)))] += 1

    def iter(self, obj: FakeProxy):
        value = self.fake_value(obj.node)
        if value is UNKNOWN:
            return super().iter(obj)
        if isinstance(value, torch.Tensor):
            self.record_decision(user_location(), "iterate", len(value))
        return iter([obj[index] for index in range(len(value))])

    def keys(self, obj: FakeProxy):
        value = self.fake_value(obj.node)
        if isinstance(value, Mapping):
            return list(value.keys())
        return super().keys(obj)

    # ----------------------------------------------------------------- report
    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def decision_report(self) -> list[dict]:
        return [
            {"file": file, "line": line, "expression": expression, "kind": kind, "value": json.loads(value), "count": count}
            for (file, line, expression, kind, value), count in self.decisions.items()
        ]
