"""CastPrecision: the graph computes in bfloat16 (or float16), weights included; inputs and outputs keep their dtype.

Matches (``fx`` frontend) the graph as a whole: its float32 parameters, buffers and tensor
attributes, its float inputs and outputs, and the layers kept in float32 (``keep_float32``)::

    def forward(self, ids, x):                      # ids: int64, x: float32
        embed = self.embed(ids)                     # nn.Embedding, float32 weight
        add = x + embed
        dense = self.dense(add)                     # nn.Linear, float32 weight and bias
        norm = self.norm(dense)                     # nn.LayerNorm: kept
        proj = self.proj(norm)
        softmax = torch.softmax(proj, dim=-1)       # softmax: kept
        out = self.out(softmax)
        return {"hidden": norm, "scores": out}

Rewrites to::

    def forward(self, ids, x):
        x_bfloat16 = x.to(torch.bfloat16)           # float inputs enter in bfloat16; ids untouched
        embed = self.embed(ids)                     # weights now bfloat16 tensors (half the bytes)
        add = x_bfloat16 + embed
        dense = self.dense(add)
        dense_float32 = dense.to(torch.float32)
        norm = self.norm(dense_float32)             # float32 weights, float32 arithmetic
        norm_bfloat16 = norm.to(torch.bfloat16)
        proj = self.proj(norm_bfloat16)
        proj_float32 = proj.to(torch.float32)
        softmax = torch.softmax(proj_float32, dim=-1)
        softmax_bfloat16 = softmax.to(torch.bfloat16)
        out = self.out(softmax_bfloat16)
        out_float32 = out.to(torch.float32)         # float outputs leave at their dtype
        return {"hidden": norm, "scores": out_float32}

A kept layer reads the value it read before the pass, never a round trip through bfloat16,
where that value exists (a float input, another kept layer's result); so does the output
(``hidden`` above). Every node the pass creates or changes is marked in
``node.meta["aot_transforms"]`` (it survives save and load), and every node's ``meta["val"]``
is recomputed, so later passes see the new dtypes. Tied weights stay tied; buffers stay
(non-)persistent.

Math: bfloat16 keeps float32's 8 exponent bits but only 8 significant bits (7 stored), so
rounding ``x`` gives ``x(1 + d)`` with ``|d| <= 2^-8`` (0.39%); float16 keeps 11 significant
bits (``|d| <= 2^-11``) but 5 exponent bits (largest 65504). Each weight is rounded once and
each op's result once more; GEMMs accumulate the bfloat16 products in float32, so a dot
product is rounded once, not once per term. Independent roundings add up like a random walk:
measured against float32, a tiny 2-layer BERT is off by at most 0.7% of its largest output,
and BERT-base (12 layers) keeps a per-sentence cosine similarity of 0.99996 or more. That is
more than float rounding order: the pass does not preserve the computation, and a recipe using
it must name an accuracy gate (``validate.accuracy``). LayerNorm and softmax stay in float32 by
default, as in ``torch.autocast``'s float32 list: their sums of squares and of exponentials
over a whole row are where 8 bits lose the most. (``scaled_dot_product_attention`` has its
softmax inside; its CPU kernels accumulate in float32.)

Whether it is faster depends on the CPU (bfloat16 dot-product instructions: AVX512_BF16, AMX)
and is measured (``aot bench``), not assumed. Running ``prepack_linear_weights`` after it
packs the bfloat16 weights for oneDNN's bfloat16 GEMM.

Left alone, with a note: tensors that are not float32 (float64 stays float64), a kept layer
that returns several values or does not compute in float32. The whole graph is left alone,
with a note, when its values cannot be recomputed on fake tensors (a graph input without a
``meta["val"]``, a leaf that needs real data), since the new dtypes could not be checked. The
pass fails naming the node when the graph cannot run in the new dtype (an op mixing dtypes that
type promotion does not reconcile): keep that node's layer in float32 with ``keep_float32``
or ``keep_float32_names``. Only the ``fx`` frontend: an ATen graph from ``torch.export`` has
the trace-time dtype baked into its ops (``_assert_tensor_metadata``, ``to(dtype=...)``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.fx import GraphModule, Node
from torch.fx.node import map_aggregate

from ._fake_values import UnrunnableNode, recompute_values
from ._modules import get_attribute, owned_module, split_target
from ._nodes import inherit_provenance, tensor_val
from .base import PassFailure
from .registry import register_pass
from .rule import Match, RewriteRule

_FLOAT32 = torch.float32


@dataclass
class _Tensors:
    """The float32 parameters, buffers and tensor attributes of one module (``owner``), each under its full target."""

    owner: str
    targets: list[str]
    readers: list[Node] = field(default_factory=list)


@dataclass
class _Input:
    node: Node


@dataclass
class _Kept:
    node: Node


@dataclass
class _Output:
    node: Node
    dtype: torch.dtype


@register_pass("cast_precision", frontends=("fx",))
class CastPrecision(RewriteRule):
    """Runs the graph in bfloat16 or float16, LayerNorm and softmax kept in float32 (not computation-preserving)."""

    preserves_computation = False

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        dtype: Literal["bfloat16", "float16"] = Field(
            default="bfloat16",
            description="What the graph computes in and its float32 weights become: bfloat16 (float32's range, 8 significant "
            "bits) or float16 (11 bits, largest 65504).",
        )
        keep_float32: list[str] = Field(
            default=["LayerNorm", "layer_norm", "softmax"],
            description="Layers computed in float32 (inputs cast up, result cast down): a module class name (LayerNorm) "
            "matches calls of such modules, which keep float32 weights; a function, method or op name, leading "
            "underscores dropped (layer_norm, softmax, log_softmax), matches calls of it.",
        )
        keep_float32_names: list[str] = Field(
            default=[],
            description="fnmatch patterns on qualified names (e.g. 'pooler.*', 'encoder.layer.11.*'): a module the graph "
            "calls or a tensor it reads whose name matches stays in float32, like a `keep_float32` layer.",
        )

    @property
    def _dtype(self) -> torch.dtype:
        return getattr(torch, self.options.dtype)

    # -- matching ----------------------------------------------------------------------

    def candidates(self, graph_module: GraphModule) -> Iterator[Match]:
        """The weights, then the float inputs, the kept layers and the float outputs, once the graph's values are known."""
        try:
            recompute_values(graph_module)
        except (UnrunnableNode, ValueError) as error:  # nothing changed yet
            yield Match.fail(f"the graph's values cannot be recomputed on fake tensors ({error}), "
                             "so the new dtypes could not be checked: nothing cast")
            return
        graph = graph_module.graph
        kept = [node for node in graph.nodes if self._is_kept(graph_module, node)]
        # What an earlier application did already: its casts, and layers it keeps in float32 (their result is float32).
        done = {node for node in graph.nodes if self.transformed(node) and (node in kept or _is_cast(node) or node.op == "placeholder")}
        outputs = [leaf for leaf in dict.fromkeys(_output_leaves(graph)) if isinstance(leaf, Node) and _is_float(leaf) and leaf not in done]
        output_dtypes = {node: tensor_val(node).dtype for node in outputs}  # before any rewrite
        yield from self._tensor_groups(graph_module, kept)
        yield from [Match.ok(_Input(node)) for node in graph.nodes if node.op == "placeholder" and _is_float(node) and node not in done]
        yield from (Match.ok(_Kept(node)) for node in kept if node not in done)
        # After the kept layers: an output that is a kept layer's result or a graph input is at its dtype already.
        yield from (Match.ok(_Output(node, output_dtypes[node])) for node in outputs
                    if node.op != "placeholder" and node not in self._original.values())

    def _is_kept(self, graph_module: GraphModule, node: Node) -> bool:
        keep, names = self.options.keep_float32, self.options.keep_float32_names
        if node.op == "call_module":
            return type(graph_module.get_submodule(str(node.target))).__name__ in keep or _matches(names, str(node.target))
        if node.op == "call_function":
            return getattr(node.target, "__name__", "").lstrip("_") in keep
        return node.op == "call_method" and str(node.target).lstrip("_") in keep

    def _tensor_groups(self, graph_module: GraphModule, kept: list[Node]) -> Iterator[Match[_Tensors]]:
        """Each module's float32 tensors, less those of kept modules, of kept names and those only kept layers read."""
        nodes = graph_module.graph.nodes
        kept_paths = {str(node.target) for node in kept if node.op == "call_module"}
        only_kept = {str(node.target) for node in nodes if node.op == "get_attr" and node.users and set(node.users) <= set(kept)}
        groups: dict[str, _Tensors] = {}
        for target, tensor in _tensors(graph_module).items():
            if not tensor.is_floating_point() or tensor.dtype == self._dtype:
                continue
            if _under(target, kept_paths) or target in only_kept or _matches(self.options.keep_float32_names, target):
                continue
            if tensor.dtype != _FLOAT32:
                yield Match.fail(f"tensor '{target}' is {tensor.dtype}, not float32: left as it is")
                continue
            owner = split_target(target)[0]
            groups.setdefault(owner, _Tensors(owner, [])).targets.append(target)
        for node in nodes:
            if node.op in ("call_module", "get_attr"):
                for group in groups.values():
                    if _under(group.owner, {str(node.target)}) or str(node.target) in group.targets:
                        group.readers.append(node)
        yield from (Match.ok(group) for group in groups.values())

    def check(self, graph_module: GraphModule, site) -> Match:
        """A kept layer must return one float32 tensor; an output already in the new dtype needs no cast."""
        if isinstance(site, _Kept):
            val = tensor_val(site.node)
            if val is None:
                return Match.fail("kept in float32, but it returns no single tensor: left as it is", node=site.node)
            if val.dtype != _FLOAT32:
                return Match.fail(f"kept in float32, but it computes in {val.dtype}: left as it is", node=site.node)
        if isinstance(site, _Input) and tensor_val(site.node).dtype == self._dtype:
            return Match.fail(f"graph input is {self.options.dtype} already", node=site.node)
        if isinstance(site, _Output) and site.dtype == self._dtype:
            return Match.fail(f"output is {self.options.dtype} already", node=site.node)
        return Match.ok(site)

    # -- rewriting ---------------------------------------------------------------------

    def rewrite(self, graph_module: GraphModule, site) -> None:
        if isinstance(site, _Tensors):
            for target in site.targets:
                parent_path, name = split_target(target)
                parent = owned_module(graph_module, parent_path)  # a copy: the caller's model keeps its tensors
                tensor = getattr(parent, name)
                if id(tensor) not in self._converted:  # one new tensor per old one, so tied weights stay tied
                    new = tensor.detach().to(self._dtype)
                    self._converted[id(tensor)] = torch.nn.Parameter(new, tensor.requires_grad) if name in parent._parameters else new
                # into the copy's own dicts, so a buffer stays (non-)persistent and an attribute stays one
                slot = parent._parameters if name in parent._parameters else parent._buffers if name in parent._buffers else None
                if slot is None:
                    setattr(parent, name, self._converted[id(tensor)])
                else:
                    slot[name] = self._converted[id(tensor)]
            for node in site.readers:
                self.mark_as_transformed(node)
        elif isinstance(site, _Input):
            self.mark_as_transformed(site.node)
            self._lower(site.node)
        elif isinstance(site, _Kept):
            node = site.node
            # It reads what it read before the pass: a float input or another kept layer's result as it is, the rest cast up.
            node.args = map_aggregate(node.args, lambda arg: self._raised(graph_module, node, arg))
            node.kwargs = map_aggregate(node.kwargs, lambda arg: self._raised(graph_module, node, arg))
            self.mark_as_transformed(node)
            self._lower(node)
        else:
            output = next(node for node in graph_module.graph.nodes if node.op == "output")
            restored = self._cast(site.node, site.dtype, before=output)
            output.args = map_aggregate(output.args, lambda arg: restored if arg is site.node else arg)

    def _lower(self, node: Node) -> None:
        """Casts ``node``'s value to the new dtype for every reader but the output."""
        lowered = self._cast(node, self._dtype, after=node)
        node.replace_all_uses_with(lowered, delete_user_cb=lambda user: user is not lowered and user.op != "output")
        self._original[lowered] = node

    def _raised(self, graph_module: GraphModule, user: Node, arg):
        """``arg`` as the kept layer ``user`` reads it: at float32 where it was float32 before the pass."""
        if not isinstance(arg, Node):
            return arg
        if arg in self._original:
            return self._original[arg]
        if arg.op == "get_attr" and get_attribute(graph_module, str(arg.target)).dtype == _FLOAT32:
            return arg  # a tensor only kept layers read: not converted
        val = tensor_val(arg)  # still the value before the pass
        return self._cast(arg, _FLOAT32, before=user) if val is not None and val.dtype == _FLOAT32 else arg

    def _cast(self, node: Node, dtype: torch.dtype, *, before: Node | None = None, after: Node | None = None) -> Node:
        with node.graph.inserting_before(before) if before is not None else node.graph.inserting_after(after):
            cast = node.graph.create_node("call_method", "to", (node, dtype), name=f"{node.name}_{str(dtype).removeprefix('torch.')}")
        inherit_provenance(node, cast)
        self.mark_as_transformed(cast)
        return cast

    def transform(self, graph_module: GraphModule) -> GraphModule:
        self._converted: dict[int, torch.Tensor] = {}
        self._original: dict[Node, Node] = {}  # a cast the pass made -> the node it casts, which holds the value before the pass
        super().transform(graph_module)
        for node in reversed(list(graph_module.graph.nodes)):  # casts left unread: their readers took the value before the pass
            if self.transformed(node) and _is_cast(node) and not node.users:
                graph_module.graph.erase_node(node)
        self._converted, self._original = {}, {}
        if not self.report.changed:
            return graph_module
        try:
            recompute_values(graph_module)
        except UnrunnableNode as error:
            raise PassFailure(
                self.name,
                f"the graph cannot run in {self.options.dtype}: {error}; keep the layer at fault in float32 "
                "(keep_float32 or keep_float32_names)",
            ) from error
        return graph_module


def _tensors(graph_module: GraphModule) -> dict[str, torch.Tensor]:
    """Parameters, buffers, and tensors the graph reads as plain attributes (fx keeps traced constants so)."""
    named = dict(graph_module.named_parameters(remove_duplicate=False))
    named.update(graph_module.named_buffers(remove_duplicate=False))
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in named:
            value = get_attribute(graph_module, str(node.target))
            if isinstance(value, torch.Tensor):
                named[str(node.target)] = value
    return named


def _output_leaves(graph) -> list:
    output = next(node for node in graph.nodes if node.op == "output")
    leaves: list = []
    map_aggregate(output.args, lambda value: leaves.append(value) or value)
    return leaves


def _is_cast(node: Node) -> bool:
    return node.op == "call_method" and node.target == "to"


def _is_float(node: Node) -> bool:
    val = tensor_val(node)
    return val is not None and val.is_floating_point()


def _under(target: str, paths: set[str]) -> bool:
    return any(target == path or target.startswith(path + ".") for path in paths)


def _matches(patterns: list[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
