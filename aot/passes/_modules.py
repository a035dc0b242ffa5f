"""Copy-on-write edits of a GraphModule's submodules, parameters and buffers.

A GraphModule made by tracing shares leaf modules (``torch.fx.symbolic_trace``)
or parameter tensors (``torch.export``) with the caller's eager model. Passes
therefore never write into an existing module: before setting or deleting an
attribute at ``a.b.c``, every module on the path ``a``, ``a.b`` is replaced in
the GraphModule by a shallow copy that the GraphModule alone owns. Tensors are
never edited in place either; passes register new ones.
"""

from __future__ import annotations

import keyword
import re
import weakref

import torch
from torch import nn
from torch.fx import GraphModule

# Modules created by passes (shallow copies and new layers); writing into them cannot reach the caller's model.
_OWNED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def split_target(target: str) -> tuple[str, str]:
    parent, _, name = target.rpartition(".")
    return parent, name


def adopt(module: nn.Module) -> nn.Module:
    """Records that ``module`` was created by a pass, so it may be written into."""
    _OWNED.add(module)
    return module


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s children and tensors, whose own attributes may be set freely."""
    clone = type(module).__new__(type(module))
    clone.__dict__ = dict(module.__dict__)
    for slot in ("_modules", "_parameters", "_buffers"):
        clone.__dict__[slot] = dict(module.__dict__[slot])
    clone.__dict__["_non_persistent_buffers_set"] = set(module.__dict__.get("_non_persistent_buffers_set", ()))
    return adopt(clone)


def owned_module(graph_module: GraphModule, path: str) -> nn.Module:
    """The module at ``path`` (``""`` is the GraphModule), after making it and its ancestors owned copies."""
    module: nn.Module = graph_module
    if not path:
        return module
    for atom in path.split("."):
        child = module._modules.get(atom)
        if child is None:
            raise AttributeError(f"'{path}' is not a submodule path of the graph module (missing '{atom}')")
        if child not in _OWNED:
            child = shallow_copy(child)
            module._modules[atom] = child
        module = child
    return module


def get_attribute(graph_module: GraphModule, target: str):
    value = graph_module
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def has_attribute(graph_module: GraphModule, target: str) -> bool:
    try:
        get_attribute(graph_module, target)
    except AttributeError:
        return False
    return True


def set_submodule(graph_module: GraphModule, target: str, module: nn.Module) -> None:
    parent, name = split_target(target)
    owned_module(graph_module, parent).add_module(name, adopt(module))


def set_tensor(graph_module: GraphModule, target: str, tensor: torch.Tensor, *, parameter: bool = True) -> None:
    """Registers ``tensor`` at ``target`` as a parameter (``parameter=True``) or a buffer."""
    parent_path, name = split_target(target)
    parent = owned_module(graph_module, parent_path)
    if hasattr(parent, name):
        delattr(parent, name)
    if parameter:
        parent.register_parameter(name, nn.Parameter(tensor, requires_grad=tensor.requires_grad))
    else:
        parent.register_buffer(name, tensor)


def delete_attribute(graph_module: GraphModule, target: str) -> None:
    parent_path, name = split_target(target)
    delattr(owned_module(graph_module, parent_path), name)


def fresh_name(module: nn.Module, base: str) -> str:
    """A valid identifier, free in ``module``, built from ``base``."""
    name = re.sub(r"\W", "_", base)
    if not name or not (name[0].isalpha() or name[0] == "_") or keyword.iskeyword(name):
        name = f"m_{name}"
    candidate, index = name, 1
    while hasattr(module, candidate):
        candidate = f"{name}_{index}"
        index += 1
    return candidate


def fresh_target(graph_module: GraphModule, parent_path: str, base: str) -> str:
    parent = get_attribute(graph_module, parent_path) if parent_path else graph_module
    name = fresh_name(parent, base)
    return f"{parent_path}.{name}" if parent_path else name


def referenced_targets(graph_module: GraphModule) -> set[str]:
    """Targets of call_module and get_attr nodes."""
    return {str(node.target) for node in graph_module.graph.nodes if node.op in ("call_module", "get_attr")}


def is_referenced(graph_module: GraphModule, target: str) -> bool:
    """Whether a node reaches ``target``, one of its children, or it through a parent module."""
    for used in referenced_targets(graph_module):
        if used == target or used.startswith(target + ".") or target.startswith(used + "."):
            return True
    return False


def delete_if_unreferenced(graph_module: GraphModule, target: str) -> bool:
    if has_attribute(graph_module, target) and not is_referenced(graph_module, target):
        delete_attribute(graph_module, target)
        return True
    return False
