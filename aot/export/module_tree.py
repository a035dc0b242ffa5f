"""The module tree of a GraphModule, as constructor source plus the tensors to store.

A GraphModule owns three kinds of things its code reaches through ``self``:

- leaf modules, the ``call_module`` targets: rebuilt by a ``torch.nn`` constructor
  call (:mod:`aot.export.leaf_constructor`) or a torch-only stand-in
  (:mod:`aot.export.torch_equivalents`);
- containers, every other submodule on the way to a leaf or a tensor: rebuilt as
  a bare ``torch.nn.Module()`` holding its own parameters and buffers;
- tensors: parameters, buffers, and plain tensor attributes (``get_attr``
  constants). Containers declare theirs as ``torch.empty`` on the meta device;
  the loader replaces every one of them with the stored weights.

A tensor reachable under two names (tied weights) is stored once; the second
name is an alias. Nothing here depends on dict or set iteration order beyond
``named_modules``, so the output is the same in every process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx

from aot.compat.torch_private import UNLIFTED_GUARDS_CLASS
from aot.errors import ExportError

from .leaf_constructor import NoConstructorForm, constructor_call, is_runtime_class, python_literal
from .torch_equivalents import leaf_replacement

_GUARDS_CLASS = UNLIFTED_GUARDS_CLASS


@dataclass
class ModuleTree:
    init_lines: list[str] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    constants: list[str] = field(default_factory=list)
    training: list[str] = field(default_factory=list)
    uses_no_guards: bool = False
    runtime_modules: list[str] = field(default_factory=list)  # aot.runtime modules whose source module.py carries


def build_module_tree(gm: torch.fx.GraphModule) -> ModuleTree:
    tree = ModuleTree()
    leaf_nodes = _call_module_nodes(gm)
    attribute_targets = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    seen_modules: dict[int, str] = {}
    seen_tensors: dict[int, str] = {}
    skipped_prefixes: list[str] = []

    for path, module in gm.named_modules(remove_duplicate=False):
        if any(path.startswith(prefix) for prefix in skipped_prefixes):
            continue
        if module.training and path in leaf_nodes and type(module).__name__ != "GuardsFn":
            # only a leaf's mode changes what it computes
            tree.training.append(path)
        if path and id(module) in seen_modules:
            tree.init_lines.append(_assignment(path, _attribute(seen_modules[id(module)])))
            skipped_prefixes.append(path + ".")
            continue
        seen_modules[id(module)] = path
        if path in leaf_nodes:
            local_tensors, rewritten = _add_leaf(tree, path, module, leaf_nodes[path])
            skipped_prefixes.append(path + ".")
            for name, tensor in local_tensors.items():
                # a rewritten tensor (a stand-in's transposed weight) is new: never an alias of the original
                _add_tensor(tree, seen_tensors, f"{path}.{name}", tensor, source=None if rewritten else tensor)
            continue
        if path:
            if isinstance(module, torch.fx.GraphModule) or path in attribute_targets:
                raise ExportError(
                    f"submodule '{path}' of type {type(module).__name__} is a nested graph;"
                    " saving graphs with higher-order-op subgraphs is not supported"
                )
            tree.init_lines.append(_assignment(path, "torch.nn.Module()"))
        _add_container_tensors(tree, seen_tensors, path, module, attribute_targets)
    return tree


def _call_module_nodes(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    nodes: dict[str, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            nodes.setdefault(node.target, node)
    return nodes


def _add_leaf(tree: ModuleTree, path: str, module: torch.nn.Module, node: torch.fx.Node):
    """Append the leaf's constructor line; return its tensors by local name and whether they were rewritten."""
    cls = type(module)
    qualified = f"{cls.__module__}.{cls.__qualname__}"
    if qualified == _GUARDS_CLASS:
        tree.uses_no_guards = True
        tree.init_lines.append(_assignment(path, "NoGuards()"))
        return {}, False
    replacement = leaf_replacement(module)
    if replacement is not None:
        tree.init_lines.append(_assignment(path, replacement.constructor) + f"  # stands in for {qualified}")
        return replacement.tensors, True
    if is_runtime_class(cls) and cls.__module__ not in tree.runtime_modules:
        tree.runtime_modules.append(cls.__module__)
    if not cls.__module__.startswith("torch.nn") and not is_runtime_class(cls):
        raise ExportError(
            f"node '{node.name}' calls module '{path}' of class {qualified}, which has no torch-only form;"
            " the saved artifact may depend on torch alone"
        )
    try:
        tree.init_lines.append(_assignment(path, constructor_call(module)))
    except NoConstructorForm as reason:
        raise ExportError(f"node '{node.name}' calls module '{path}' ({qualified}) that cannot be rebuilt: {reason}")
    local = {name: tensor for name, tensor in module.named_parameters(remove_duplicate=False)}
    local.update({name: tensor for name, tensor in module.named_buffers(remove_duplicate=False)})
    return local, False


def _add_container_tensors(tree, seen_tensors, path, module, attribute_targets) -> None:
    prefix = f"{path}." if path else ""
    for name, parameter in module._parameters.items():
        if parameter is None:
            continue
        qualified = prefix + name
        if _add_tensor(tree, seen_tensors, qualified, parameter, source=parameter):
            continue
        tree.init_lines.append(_assignment(qualified, f"torch.nn.Parameter({_empty(parameter)}, requires_grad=False)"))
    for name, buffer in module._buffers.items():
        if buffer is None:
            continue
        qualified = prefix + name
        persistent = name not in module._non_persistent_buffers_set
        if _add_tensor(tree, seen_tensors, qualified, buffer, source=buffer):
            continue
        owner = _attribute(path) if path else "self"
        tree.init_lines.append(f"{owner}.register_buffer({name!r}, {_empty(buffer)}, persistent={persistent})")
    for name, value in vars(module).items():
        qualified = prefix + name
        if isinstance(value, torch.Tensor) and qualified in attribute_targets:
            if _add_tensor(tree, seen_tensors, qualified, value, source=value):
                continue
            tree.constants.append(qualified)
            tree.init_lines.append(_assignment(qualified, _empty(value)))
    for target in sorted(attribute_targets):
        owner_path, _, leaf = target.rpartition(".")
        if owner_path == path and not _is_tensor_attribute(module, leaf):
            value = getattr(module, leaf, None)
            if not isinstance(value, torch.nn.Module):
                raise ExportError(
                    f"get_attr target '{target}' is a {type(value).__name__}, not a tensor; it cannot be saved"
                )


def _is_tensor_attribute(module: torch.nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), torch.Tensor)


def _add_tensor(tree, seen_tensors, qualified, tensor, source) -> bool:
    """Record ``tensor`` under ``qualified``; True when it is an alias of a tensor already stored."""
    key = id(source) if source is not None else None
    if key is not None and key in seen_tensors:
        tree.aliases[qualified] = seen_tensors[key]
        return True
    if tensor.is_meta or type(tensor).__name__ == "FakeTensor":
        raise ExportError(f"tensor '{qualified}' has no data (it lives on the meta device or is fake)")
    if key is not None:
        seen_tensors[key] = qualified
    tree.tensors[qualified] = tensor.detach()
    return False


def _empty(tensor: torch.Tensor) -> str:
    shape = python_literal(tuple(tensor.shape))
    return f"torch.empty({shape}, dtype={tensor.dtype})"


def _assignment(path: str, value: str) -> str:
    owner, _, leaf = path.rpartition(".")
    if leaf.isidentifier():
        return f"{_attribute(path)} = {value}"
    return f"setattr({_attribute(owner)}, {leaf!r}, {value})"


def _attribute(path: str) -> str:
    """``self.encoder.layer[0]``-style access that stays valid for names like ``0``."""
    expression = "self"
    for part in path.split(".") if path else []:
        expression = f"{expression}.{part}" if part.isidentifier() else f"getattr({expression}, {part!r})"
    return expression
