"""A GraphModule's graph as JSON data, and back: the body of ``meta.json``.

``module.py`` runs the graph; ``meta.json`` describes it node by node so
:func:`aot.export.load` can rebuild the very same ``torch.fx.Graph`` (names,
ops, targets, arguments, meta) on top of the module tree that ``module.py``
builds. Layout::

    {"format": "aot.graph/1", "class_name": "...", "codegen": {...},
     "graph_meta": {"trace_report": {...}, ...},
     "nodes": [{"name": "fc", "op": "call_module", "target": "fc",
                "args": {"__tuple__": [{"__node__": "x"}]}, "kwargs": {"__dict__": []},
                "meta": {"scope": ..., "aot_transforms": ["merge_linears"], "aot_reverse": {...}},
                "value": {"shape": [2, "s0"], "dtype": "float32"}}, ...]}

``meta`` holds what :mod:`aot.export.node_meta` keeps: the tracer's ``scope`` (and
torch's ``nn_module_stack``), and the pass marks of :mod:`aot.passes.base`
(``aot_transforms``: the passes that changed the node; ``aot_reverse``: what each
reversible one needs to undo it). ``value`` is the shape and dtype of the node's
result, read from its fake value before that is dropped.

A ``call_function`` target is stored as ``{"__function__": name}``, its importable
qualified name (``torch.ops.aten.linear.default``, ``_operator.getitem``); saving
checks that the name resolves back to the same object. Arguments are tagged here:
``__node__``, ``__tuple__``, ``__dict__`` (every dict, as key-value pairs),
``__size__``, ``__slice__``, ``__dtype__``, ``__float__`` (non-finite),
``__device__``, ``__layout__``, ``__memory_format__``, ``__ellipsis__`` and
``__complex__``.
"""

from __future__ import annotations

import importlib
import json
import math
from typing import Any

import torch
import torch.fx
from torch.fx.graph import CodeGen

from aot.compat.torch_private import PyTreeCodeGen, PyTreeInfo, get_qualified_name, pytree
from aot.errors import ExportError

from .node_meta import decode_meta, describe_value, encode_meta, encode_value

FORMAT = "aot.graph/1"


def encode_graph(gm: torch.fx.GraphModule) -> dict[str, Any]:
    nodes = []
    for node in gm.graph.nodes:
        nodes.append(
            {
                "name": node.name,
                "op": node.op,
                "target": _encode_target(node),
                "args": _encode_argument(node.args, node),
                "kwargs": _encode_argument(dict(node.kwargs), node),
                "meta": encode_meta(node.meta, node.name),
                "value": describe_value(node.meta),
            }
        )
    return {
        "format": FORMAT,
        "class_name": type(gm).__name__,
        "codegen": _encode_codegen(gm.graph._codegen),
        "graph_meta": encode_meta(getattr(gm, "meta", {}) or {}, "<graph>"),
        "nodes": nodes,
    }


def decode_graph(document: dict[str, Any], source: str) -> tuple[torch.fx.Graph, dict[str, Any]]:
    """Rebuild the graph; also return the attributes the GraphModule must carry (pytree specs)."""
    if document.get("format") != FORMAT:
        raise ExportError(f"{source}: format {document.get('format')!r} is not {FORMAT!r}")
    graph = torch.fx.Graph()
    by_name: dict[str, torch.fx.Node] = {}
    for entry in document["nodes"]:
        target = _decode_target(entry, source)
        args = _decode_argument(entry["args"], by_name)
        kwargs = _decode_argument(entry["kwargs"], by_name)
        if entry["op"] == "output":
            node = graph.output(args[0])
        else:
            node = graph.create_node(entry["op"], target, tuple(args), kwargs, name=entry["name"])
        if node.name != entry["name"]:
            raise ExportError(f"{source}: node '{entry['name']}' was renamed to '{node.name}' on load")
        node.meta.update(decode_meta(entry["meta"]))
        by_name[node.name] = node
    attributes = _decode_codegen(graph, document["codegen"], source)
    return graph, attributes


def dumps(document: dict[str, Any]) -> str:
    """JSON with one node per line: compact, and a diff of two saves shows which nodes changed."""
    head = {key: value for key, value in document.items() if key != "nodes"}
    lines = [f" {_compact(key)}: {_compact(value)}," for key, value in head.items()]
    nodes = [f"  {_compact(node)}" for node in document["nodes"]]
    return "{\n" + "\n".join(lines) + '\n "nodes": [\n' + ",\n".join(nodes) + "\n ]\n}\n"


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False, allow_nan=False, ensure_ascii=True)


def resolve_qualified_name(name: str) -> Any:
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except Exception:  # not a module path at this length; try a shorter one
            continue
        for part in parts[split:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"cannot import {name}")


def function_name(target: Any) -> str:
    """The importable name of a call_function target, checked to resolve back to it."""
    name = get_qualified_name(target)
    try:
        resolved = resolve_qualified_name(name)
    except Exception:
        resolved = None
    if resolved is not target:
        module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
        name = f"{module}.{qualname}"
        try:
            resolved = resolve_qualified_name(name)
        except Exception:
            resolved = None
    if resolved is not target:
        raise ExportError(f"call_function target {target!r} has no importable name")
    return name


def _encode_target(node: torch.fx.Node) -> Any:
    if node.op != "call_function":
        return node.target
    try:
        return {"__function__": function_name(node.target)}
    except ExportError as error:
        raise ExportError(f"node '{node.name}': {error}") from None


def _decode_target(entry: dict[str, Any], source: str) -> Any:
    target = entry["target"]
    if isinstance(target, dict):
        try:
            return resolve_qualified_name(target["__function__"])
        except Exception as error:
            raise ExportError(
                f"{source}: node '{entry['name']}' calls {target['__function__']}, which cannot be imported: {error}"
            ) from None
    return target


def _encode_argument(value: Any, node: torch.fx.Node) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"__node__": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": str(value)}
    if isinstance(value, torch.Size):
        return {"__size__": list(value)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_argument(item, node) for item in value]}
    if isinstance(value, list):
        return [_encode_argument(item, node) for item in value]
    if isinstance(value, dict):
        return {"__dict__": [[_encode_argument(k, node), _encode_argument(v, node)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"__slice__": [_encode_argument(part, node) for part in (value.start, value.stop, value.step)]}
    if isinstance(value, torch.dtype):
        return encode_value(value)
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if isinstance(value, torch.layout):
        return {"__layout__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"__memory_format__": str(value).removeprefix("torch.")}
    if value is Ellipsis:
        return {"__ellipsis__": True}
    if isinstance(value, complex):
        return {"__complex__": [value.real, value.imag]}
    raise ExportError(f"node '{node.name}' has an argument of type {type(value).__name__} that cannot be saved")


def _decode_argument(value: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode_argument(item, nodes) for item in value]
    if not isinstance(value, dict):
        return value
    (tag, payload), = value.items()
    if tag == "__node__":
        return nodes[payload]
    if tag == "__tuple__":
        return tuple(_decode_argument(item, nodes) for item in payload)
    if tag == "__dict__":
        return {_decode_argument(k, nodes): _decode_argument(v, nodes) for k, v in payload}
    if tag == "__size__":
        return torch.Size(payload)
    if tag == "__slice__":
        return slice(*(_decode_argument(part, nodes) for part in payload))
    if tag == "__dtype__":
        return getattr(torch, payload)
    if tag == "__float__":
        return float(payload)
    if tag == "__device__":
        return torch.device(payload)
    if tag == "__layout__":
        return getattr(torch, payload)
    if tag == "__memory_format__":
        return getattr(torch, payload)
    if tag == "__ellipsis__":
        return Ellipsis
    if tag == "__complex__":
        return complex(*payload)
    raise ExportError(f"unknown argument tag {tag!r}")


def _encode_codegen(codegen: CodeGen) -> dict[str, Any]:
    if type(codegen) is CodeGen:
        return {"kind": "plain"}
    if type(codegen) is PyTreeCodeGen:
        info = codegen.pytree_info
        return {
            "kind": "pytree",
            "orig_args": list(info.orig_args),
            "in_spec": pytree.treespec_dumps(info.in_spec) if info.in_spec is not None else None,
            "out_spec": pytree.treespec_dumps(info.out_spec) if info.out_spec is not None else None,
        }
    raise ExportError(f"graph code generator {type(codegen).__name__} is not supported")


def _decode_codegen(graph: torch.fx.Graph, encoded: dict[str, Any], source: str) -> dict[str, Any]:
    if encoded["kind"] == "plain":
        return {}
    in_spec = _load_spec(encoded["in_spec"], source)
    out_spec = _load_spec(encoded["out_spec"], source)
    graph._codegen = PyTreeCodeGen(PyTreeInfo(encoded["orig_args"], in_spec, out_spec))
    return {"_in_spec": in_spec, "_out_spec": out_spec}


def _load_spec(serialized: str | None, source: str):
    if serialized is None:
        return None
    for type_name in _spec_type_names(json.loads(serialized)):
        module = type_name.rpartition(".")[0]
        try:  # the module that registered the output type must be imported before loading the spec
            importlib.import_module(module)
        except Exception as error:
            raise ExportError(f"{source}: output type {type_name} cannot be imported: {error}") from None
    return pytree.treespec_loads(serialized)


def _spec_type_names(value: Any) -> list[str]:
    names = []
    if isinstance(value, dict):
        if isinstance(value.get("type"), str) and "." in value["type"]:
            names.append(value["type"])
        for item in value.values():
            names += _spec_type_names(item)
    elif isinstance(value, list):
        for item in value:
            names += _spec_type_names(item)
    return names
