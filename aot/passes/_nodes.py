"""Small helpers over torch.fx nodes shared by the passes."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from ._modules import delete_if_unreferenced, get_attribute

logger = logging.getLogger(__name__)

_MISSING = object()
# Metadata that describes where a node comes from; a node that replaces another inherits it.
_PROVENANCE_KEYS = ("scope", "nn_module_stack", "stack_trace", "source_fn_stack", "torch_fn", "from_node")


def argument(node: Node, index: int, name: str, default: Any = _MISSING) -> Any:
    """The argument at position ``index`` or keyword ``name`` of ``node``."""
    if len(node.args) > index:
        return node.args[index]
    if name in node.kwargs:
        return node.kwargs[name]
    if default is _MISSING:
        raise KeyError(f"node '{node.name}' has no argument '{name}'")
    return default


def set_argument(node: Node, index: int, name: str, value: Any) -> None:
    """Sets what :func:`argument` reads: position ``index`` when ``node`` passes it positionally, else keyword ``name``."""
    if len(node.args) > index:
        node.update_arg(index, value)
    else:
        node.update_kwarg(name, value)


def is_call(node: Node, *targets: Any) -> bool:
    return node.op == "call_function" and node.target in targets


def is_get_attr(value: Any) -> bool:
    """Whether ``value`` is a node reading a parameter or buffer (export graphs read weights this way)."""
    return isinstance(value, Node) and value.op == "get_attr"


def inherit_provenance(source: Node, node: Node) -> None:
    for key in _PROVENANCE_KEYS:
        if key in source.meta and key not in node.meta:
            node.meta[key] = source.meta[key]


def tensor_val(node: Any) -> torch.Tensor | None:
    """The FakeTensor recorded for ``node`` by tracing, if any."""
    if isinstance(node, Node):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val
    return None


def infer_val(graph_module: GraphModule, node: Node) -> None:
    """Fills ``node.meta["val"]`` by running the node on the FakeTensors of its inputs.

    Only when the graph carries FakeTensors already; a failure leaves ``val`` unset,
    which later passes treat as "shape unknown".
    """
    from aot.compat.torch_private import detect_fake_mode

    sources = node.all_input_nodes or [n for n in node.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode([val for val in (n.meta.get("val") for n in sources) if isinstance(val, torch.Tensor)])
    if fake_mode is None:
        return
    try:
        with fake_mode:
            if node.op == "get_attr":
                node.meta["val"] = fake_mode.from_tensor(get_attribute(graph_module, str(node.target)), static_shapes=True)
                return
            args = map_arg(node.args, lambda arg: arg.meta["val"])
            kwargs = map_arg(node.kwargs, lambda arg: arg.meta["val"])
            if node.op == "call_function":
                node.meta["val"] = node.target(*args, **kwargs)
            elif node.op == "call_method":
                node.meta["val"] = getattr(args[0], node.target)(*args[1:], **kwargs)
            elif node.op == "call_module":
                module = graph_module.get_submodule(str(node.target))
                state = {key: fake_mode.from_tensor(value, static_shapes=True) for key, value in module.state_dict(keep_vars=True).items()}
                node.meta["val"] = torch.func.functional_call(module, state, tuple(args), dict(kwargs))
    except Exception as error:  # metadata is best effort; the graph itself is unaffected
        logger.debug("could not infer meta['val'] of node %s: %s", node.name, error)
        node.meta.pop("val", None)


def replace_with(node: Node, replacement: Node) -> None:
    """Reroutes every use of ``node`` to ``replacement`` and erases ``node``."""
    node.replace_all_uses_with(replacement)
    node.graph.erase_node(node)


def bypass(graph_module: GraphModule, node: Node, source: Node) -> None:
    """Removes ``node``, whose result is ``source`` unchanged: its users read ``source``.

    A module it called is deleted once no node calls it any more.
    """
    replace_with(node, source)
    if node.op == "call_module":
        delete_if_unreferenced(graph_module, str(node.target))


def called_on_one_input(node: Node) -> bool:
    """Whether a module call passes exactly one node, positionally or as ``input=``, as ``nn.Linear`` takes it."""
    operands = list(node.args) + list(node.kwargs.values())
    return len(operands) == 1 and isinstance(operands[0], Node) and not set(node.kwargs) - {"input"}
