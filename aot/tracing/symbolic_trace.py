"""``symbolic_trace``: a Hugging Face (or plain) model to a module-level torch.fx GraphModule.

    gm = symbolic_trace(BertModel(config), ["input_ids", "attention_mask"])
    gm(input_ids=ids, attention_mask=mask)   # {"last_hidden_state": ..., "pooler_output": ...}

- placeholders are named exactly after ``input_names``; the model's other
  ``forward`` arguments keep their defaults, or the values in ``concrete_args``; the KV cache
  may be named ``past_key_values`` or ``cache`` whichever the forward spells (:mod:`aot.tracing.input_names`);
- the graph returns what the model returns, with ``ModelOutput`` as a plain dict of its
  non-``None`` fields (so ``aot.tracing.outputs.flatten_outputs`` names match eager);
- ``use_cache`` is traced as ``False`` unless given: a cache object is not a tensor output;
- the GraphModule owns copies of the modules, parameters and buffers it uses: the eager
  model is never touched, not even by a later ``gm.to(...)`` or an in-place pass;
- ``gm.meta["trace_report"]`` says what was decided on traced values, what was baked in,
  and what had to be restored on the model;
- unless ``disable_check=True``, a graph traced on dummy inputs made here is checked
  against the model at a second shape (:mod:`aot.tracing.shape_check`), and example inputs
  with a size-0 or size-1 dimension are noted, since they can specialise the graph.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.nn.utils import parametrize

from aot.compat.torch_private import lazy_clone
from aot.errors import TraceError
from aot.process.quiet import quiet_torch

from .dummy_inputs import default_input_names, forward_parameters, make_dummy_inputs
from .input_names import forward_keyword, forward_keywords
from .parametrized_leaves import make_picklable
from .model_state import config_use_cache_off, disable_hooked_forward, preserved_model_state, traceable_experts
from .shape_check import check_at_second_shape, specialising_sizes
from .tracer import HFTracer

logger = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("sdpa", "eager", None)


def _is_hf_model(model: torch.nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(model, PreTrainedModel)


def resolve_function(spec: Callable | str) -> Callable:
    """A callable, or ``"package.module:function"``."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise TraceError(f"autowrap_functions entry {spec!r} is not a callable nor 'package.module:function'")
    module_name, _, attr = spec.partition(":")
    try:
        value = importlib.import_module(module_name)
        for atom in attr.split("."):
            value = getattr(value, atom)
    except (ImportError, AttributeError) as error:
        raise TraceError(f"autowrap_functions entry '{spec}' cannot be imported: {error}") from error
    if not callable(value):
        raise TraceError(f"autowrap_functions entry '{spec}' is not callable")
    return value


def _check_model(model: torch.nn.Module, input_names: Sequence[str], dummy_inputs: Mapping[str, Any] | None) -> None:
    parameters = forward_parameters(model)
    for name in input_names:
        if forward_keyword(name, parameters) is None:
            raise TraceError(
                f"model {type(model).__name__} has no input '{name}'; its inputs are: {', '.join(parameters)}"
            )
    if len(set(forward_keywords(input_names, parameters).values())) != len(input_names):
        raise TraceError(f"input_names of {type(model).__name__} name an input twice: {list(input_names)}")
    if dummy_inputs is not None:
        for name in input_names:
            if name not in dummy_inputs:
                raise TraceError(f"dummy_inputs for {type(model).__name__} have no value for input '{name}'")
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        raise TraceError(
            f"model {type(model).__name__} uses attention implementation '{implementation}', which the fx tracer "
            f"does not support; load it with attn_implementation='sdpa' or 'eager', or use the export frontend"
        )


class _OutputAdapter:
    """Model outputs to what a graph can return: ModelOutput -> dict, caches dropped."""

    def __init__(self):
        self.dropped: list[str] = []

    def __call__(self, value: Any, prefix: str = "") -> Any:
        if value is None or isinstance(value, (torch.fx.Proxy, torch.Tensor, bool, int, float, str)):
            return value
        if isinstance(value, Mapping) or hasattr(value, "to_tuple"):
            items = value.items()
            return {key: self(item, f"{prefix}{key}.") for key, item in items if item is not None}
        if isinstance(value, (tuple, list)):
            return tuple(self(item, f"{prefix}{index}.") for index, item in enumerate(value))
        self.dropped.append(f"{prefix.rstrip('.') or 'output'} ({type(value).__name__})")
        return None


def _remove_unused_python_values(graph: torch.fx.Graph, tracer: HFTracer) -> int:
    """Drop unused nodes that compute no tensor (``size()``, ``getitem`` of a shape, ``getattr``...).

    Unused tensor-valued nodes stay: they may be in-place updates.
    """
    removed = 0
    for node in reversed(list(graph.nodes)):
        if node.users or node.op not in ("call_function", "call_method", "get_attr"):
            continue
        if node.op == "call_function" and (node.target is operator.setitem or node.is_impure()):
            continue
        if node.op == "get_attr" or tracer.is_python_value(node):
            graph.erase_node(node)
            removed += 1
    return removed


def _copy_on_write(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor sharing ``tensor``'s memory until either is written to (then it is copied)."""
    try:
        return lazy_clone(tensor)
    except (AttributeError, RuntimeError):  # pragma: no cover - older torch or exotic tensors
        return tensor.clone()


def _tensor_copies(model: torch.nn.Module) -> dict[int, Any]:
    """A deepcopy memo that copies parameters and buffers copy-on-write: instant, and safe for the model."""
    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        if type(parameter) is torch.nn.Parameter:
            memo[id(parameter)] = torch.nn.Parameter(
                _copy_on_write(parameter.detach()), requires_grad=parameter.requires_grad
            )
    for buffer in model.buffers():
        if type(buffer) is torch.Tensor:
            memo[id(buffer)] = _copy_on_write(buffer)
    return memo


def _build_graph_module(model: torch.nn.Module, graph: torch.fx.Graph, tracer: HFTracer) -> torch.fx.GraphModule:
    """A GraphModule over deep copies of exactly what the graph uses (ties between them kept).

    Parameters and buffers are copied copy-on-write, so passes may change the
    GraphModule in place (``gm.to(torch.bfloat16)``, fusing weights) without
    touching the eager model, and tracing a large model stays fast.
    """
    memo = _tensor_copies(model)
    shadow = torch.nn.Module()
    buffer_names = {name for name, _ in model.named_buffers()}
    targets = sorted({node.target for node in graph.nodes if node.op in ("call_module", "get_attr")}, key=lambda t: t.count("."))
    for target in targets:
        if target in tracer.constants:
            value, is_buffer = tracer.constants[target], True
        elif target in tracer.inserted_modules:
            value, is_buffer = tracer.inserted_modules[target], False
        else:
            value = model
            for atom in target.split("."):
                value = getattr(value, atom)
            is_buffer = target in buffer_names
        owner = shadow
        *parents, field = target.split(".")
        for atom in parents:
            if not hasattr(owner, atom):
                owner.add_module(atom, torch.nn.Module())
            owner = getattr(owner, atom)
        if hasattr(owner, field):
            continue
        copied = copy.deepcopy(value, memo)
        if isinstance(copied, torch.nn.Module) and parametrize.is_parametrized(copied):
            copied = make_picklable(copied)  # torch's parametrized classes refuse pickle; a GraphModule is pickled whole
        if is_buffer:
            owner.register_buffer(field, copied)
        else:
            setattr(owner, field, copied)
    gm = torch.fx.GraphModule(shadow, graph, class_name=type(model).__name__)
    return gm


def symbolic_trace(
    model: torch.nn.Module,
    input_names: Sequence[str] | None = None,
    disable_check: bool = False,
    *,
    concrete_args: dict[str, Any] | None = None,
    dummy_inputs: Mapping[str, Any] | None = None,
    leaf_modules: Iterable[type | str] = (),
    autowrap_functions: Iterable[Callable | str] = (),
    tracer_cls: type[HFTracer] | None = None,
) -> torch.fx.GraphModule:
    """Trace ``model`` into a GraphModule; see the module docstring. Raises ``TraceError``, and ``TypeError`` for
    arguments of the wrong kind."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"symbolic_trace traces a torch.nn.Module, not {type(model).__name__}")
    if isinstance(input_names, str):  # list() of it would be its letters
        raise TypeError(f"input_names is a sequence of names, not one string: [{input_names!r}]?")
    started = time.perf_counter()
    is_hf = _is_hf_model(model)
    leaf_modules = tuple(leaf_modules)
    if input_names is None:
        if is_hf:
            input_names = default_input_names(model)
        elif dummy_inputs is not None:
            input_names = list(dummy_inputs)
    input_names = list(input_names) if input_names is not None else None
    if input_names is not None and not disable_check:
        _check_model(model, input_names, dummy_inputs)
    made_dummy_inputs = input_names is not None and dummy_inputs is None and is_hf
    if made_dummy_inputs:
        dummy_inputs = make_dummy_inputs(model, input_names)

    static_kwargs = dict(concrete_args or {}) if input_names is not None else {}
    notes = specialising_sizes(dummy_inputs) if dummy_inputs is not None and not made_dummy_inputs else []
    # A head whose forward hands **kwargs to its base model (decoders' *ForQuestionAnswering) takes no
    # use_cache of its own: the config's is turned off while tracing, or the base model builds a cache.
    takes_use_cache = "use_cache" in forward_parameters(model)
    if is_hf and input_names is not None and takes_use_cache:
        if "use_cache" not in input_names and "use_cache" not in static_kwargs:
            static_kwargs["use_cache"] = False
            notes.append("traced with use_cache=False")
    cache_off = config_use_cache_off(model) if is_hf and not takes_use_cache else contextlib.nullcontext(False)

    tracer = (tracer_cls or HFTracer)(
        leaf_modules=leaf_modules,
        autowrap_functions=tuple(resolve_function(fn) for fn in autowrap_functions),
    )
    adapter = _OutputAdapter()
    with cache_off as turned_off, disable_hooked_forward(model), preserved_model_state(model) as restored, traceable_experts(model) as experts_note:
        if turned_off:
            notes.append("traced with config.use_cache=False")
        if experts_note:
            notes.append(experts_note)
        try:
            with quiet_torch("the fx tracer"):  # fake tensors log the error of an op that fails on them
                graph = tracer.trace_model(
                    model,
                    input_names,
                    dummy_inputs,
                    static_kwargs=static_kwargs,
                    concrete_args=concrete_args,
                    output_adapter=adapter,
                    forward_keywords=forward_keywords(input_names, forward_parameters(model)) if input_names is not None else None,
                )
        except TraceError:
            raise
        except torch.fx.proxy.TraceError as error:
            raise TraceError(f"cannot trace {type(model).__name__}: {error}") from error
    if restored:
        logger.debug("restored after tracing %s: %s", type(model).__name__, restored)
    _remove_unused_python_values(graph, tracer)
    gm = _build_graph_module(model, graph, tracer)
    if made_dummy_inputs and not disable_check:  # what callers of the old API took the check to mean
        with disable_hooked_forward(model), preserved_model_state(model):
            notes.append(check_at_second_shape(model, gm, input_names, static_kwargs))
    gm.meta["trace_report"] = {
        "frontend": "fx",
        "model": type(model).__name__,
        "input_names": [node.target for node in graph.nodes if node.op == "placeholder"],
        "input_shapes": {
            name: list(value.shape) for name, value in (dummy_inputs or {}).items() if isinstance(value, torch.Tensor)
        },
        "static_kwargs": {key: repr(value) for key, value in static_kwargs.items()},
        "leaf_modules": sorted(
            {node.meta["scope"].module_type for node in graph.nodes if node.op == "call_module"}
        ),
        "extra_leaf_modules": list(tracer.leaf_policy.specs),
        "decisions": tracer.decision_report(),
        "baked_constants": tracer.baked_constants,
        "restored_attributes": restored,
        "dropped_outputs": adapter.dropped,
        "notes": notes + tracer.notes,
        "num_nodes": len(graph.nodes),
        "duration_s": round(time.perf_counter() - started, 4),
    }
    return gm
