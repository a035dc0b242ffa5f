"""GroupQueryAttention: attention over repeated key/value heads reads the cache once, grouping the queries instead.

Grouped-query attention (Llama 3, Mistral, Qwen2/3, Phi-3, Gemma 3) has ``H`` query heads over
``Hkv = H / n`` key/value heads. Transformers' SDPA path repeats each key/value head ``n`` times
(``repeat_kv``) before the attention, which copies the whole cache, keys and values, ``n`` times at
every step: for Llama-3.2-1B (n = 4, 16 layers) at 256 cached tokens that is 67 MB written and read
again per generated token, beside the ~0.7 GB of its int4 weights. Matches::

    k_rep = k[:, :, None, :, :].expand(B, Hkv, n, T, D).reshape(B, Hkv * n, T, D)     # also v
    out   = F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask, dropout_p=0.0, scale=s)

    # export frontend: aten.unsqueeze(k, 2) -> aten.expand(.., [B, Hkv, n, T, D]) -> [aten.clone] ->
    # aten.reshape / aten.view / aten._unsafe_view -> aten.scaled_dot_product_attention

Rewrites to::

    q_g    = q.unflatten(1, (-1, n)).flatten(2, 3)                        # (B, Hkv, n*S, D), a view
    mask_g = mask.unsqueeze(2).expand(-1, -1, n, -1, -1).flatten(2, 3)    # (B, 1, n*S, T): the mask, n times
    out_g  = F.scaled_dot_product_attention(q_g, k, v, attn_mask=mask_g, dropout_p=0.0, scale=s)
    out    = out_g.unflatten(2, (n, -1)).flatten(1, 2)                    # (B, H, S, Dv), a view
                                                  # (aten.unflatten.int, aten.flatten.using_ints, ... on export)

Math: ``repeat_kv`` gives query head ``h`` the key/value head ``h // n``. Unflattening the head dim
into ``(Hkv, n)`` puts head ``h = j·n + r`` at ``(j, r)``, and folding ``r`` into the rows makes
query row ``(h, i)`` row ``r·S + i`` of group ``j``, which attends to key/value head ``j``: the very
scores ``q_(h,i) · k_(j,t) · s``, the same mask row ``i`` (repeated per ``r``), the same softmax
over ``t`` and the same weighted sum of ``v_j``. Each output row is computed from the same numbers
in the same order, so the pass preserves the computation. Only the mask, ``n·S·T`` booleans, is
copied; the queries and the output move as views.

Both artifacts gain: the saved GraphModule's SDPA and the ONNX model's attention (MatMul, Softmax,
MatMul) read each cached key and value once instead of ``n`` times. ONNX Runtime's own fused
``GroupQueryAttention`` needs its own cache layout and sequence lengths; this rewrite keeps the
model's inputs and outputs as they are.

Left alone, with a note: an attention that is causal by flag (``is_causal=True``: its diagonal is
per query row, which grouping moves), has dropout, already groups (``enable_gqa``), takes a mask
with a head dimension other than 1, or whose repeated keys are read by anything else than the
attention and the size reads that repeating does not change; and any shape not recorded in
``meta["val"]``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node


from ._nodes import argument, infer_val, inherit_provenance, is_call, set_argument, tensor_val
from .registry import register_pass
from .rule import Match, RewriteRule

_aten = torch.ops.aten
_SDPA = (F.scaled_dot_product_attention, _aten.scaled_dot_product_attention.default)
_ATEN_RESHAPES = (_aten.reshape.default, _aten.view.default, _aten._unsafe_view.default)
_NEW_HEAD_AXIS = (slice(None), slice(None), None, slice(None), slice(None))  # k[:, :, None, :, :]
_SIZES_KEPT = {0, 2, 3, -1, -2, -4}  # batch, length and head size: the same before and after repeating heads
# The rewrite's steps: Tensor methods on an fx graph, their ATen overloads on an export graph (same arguments).
_ATEN_STEPS = {"unflatten": _aten.unflatten.int, "flatten": _aten.flatten.using_ints, "unsqueeze": _aten.unsqueeze.default,
               "expand": _aten.expand.default}


@dataclass(frozen=True)
class _Repeated:
    """A ``repeat_kv`` chain: ``source`` (B, Hkv, T, D) repeated ``times`` per head, through ``nodes`` (last first)."""

    source: Node
    times: int
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class _Site:
    attention: Node
    query: Node
    key: _Repeated
    value: _Repeated
    mask: Node | None


@register_pass("group_query_attention")
class GroupQueryAttention(RewriteRule):
    """Attention over repeated key/value heads reads each head once, with the queries grouped per head."""

    preserves_computation = True

    def pattern(self, graph_module: GraphModule, node: Node) -> bool:
        """An attention whose keys are repeated heads (multi-head attention without repeats is no site)."""
        return is_call(node, *_SDPA) and bool(_repeated_heads(argument(node, 1, "key")))

    def check(self, graph_module: GraphModule, node: Node) -> Match[_Site]:
        """Literal non-causal, dropout-free attention whose keys and values are one repeat of the same width."""
        query, key, value = (argument(node, index, name) for index, name in enumerate(("query", "key", "value")))
        mask = argument(node, 3, "attn_mask", None)
        if argument(node, 4, "dropout_p", 0.0) != 0.0:
            return Match.fail("it has dropout", node=node)
        if argument(node, 5, "is_causal", False) is not False:
            return Match.fail("it is causal by flag: the diagonal is per query row, which grouping moves", node=node)
        if node.kwargs.get("enable_gqa", False) is not False:
            return Match.fail("it groups its queries already (enable_gqa)", node=node)
        repeated_key, repeated_value = _repeated_heads(key), _repeated_heads(value)
        if not repeated_value:
            return Match.fail(f"its values are no repeat of key/value heads ({repeated_value.reason})", node=node)
        times = repeated_key.value.times
        if repeated_value.value.times != times:
            return Match.fail(f"its keys are repeated {times} times, its values {repeated_value.value.times}", node=node)
        shapes = _check_shapes(node, query, repeated_key.value, repeated_value.value, mask)
        if shapes:
            return Match.fail(shapes, node=node)
        for repeated in (repeated_key.value, repeated_value.value):
            reader = _other_reader(repeated, node)
            if reader is not None:
                return Match.fail(f"its repeated heads are also read by node '{reader.name}'", node=node)
        return Match.ok(_Site(node, query, repeated_key.value, repeated_value.value, mask))

    def rewrite(self, graph_module: GraphModule, site: _Site) -> None:
        graph, attention, times = graph_module.graph, site.attention, site.key.times
        on_aten = attention.target is not F.scaled_dot_product_attention
        added = []

        def step(name: str, *args) -> Node:
            new = graph.call_function(_ATEN_STEPS[name], args) if on_aten else graph.call_method(name, args)
            inherit_provenance(attention, new)
            added.append(new)
            return new

        with graph.inserting_before(attention):
            query = step("flatten", step("unflatten", site.query, 1, [-1, times]), 2, 3)
            mask = site.mask
            if mask is not None:
                mask = step("flatten", step("expand", step("unsqueeze", mask, 2), [-1, -1, times, -1, -1]), 2, 3)
        set_argument(attention, 0, "query", query)
        set_argument(attention, 1, "key", site.key.source)
        set_argument(attention, 2, "value", site.value.source)
        if site.mask is not None:
            set_argument(attention, 3, "attn_mask", mask)
        with graph.inserting_after(attention):
            per_group = step("unflatten", attention, 2, [times, -1])
        with graph.inserting_after(per_group):
            heads = step("flatten", per_group, 1, 2)
        attention.replace_all_uses_with(heads, delete_user_cb=lambda user: user is not per_group)
        for repeated in (site.key, site.value):
            _drop(graph, repeated)
        for new in [*added[:-2], attention, per_group, heads]:
            infer_val(graph_module, new)


def _repeated_heads(node) -> Match[_Repeated]:
    """``node`` as ``source[:, :, None, :, :].expand(B, Hkv, n, T, D).reshape(B, Hkv * n, T, D)``, n > 1 a literal."""
    if not (_is_method(node, "reshape") or is_call(node, *_ATEN_RESHAPES)):
        return Match.fail("not a reshape")
    chain = [node]
    expand = node.args[0]
    if is_call(expand, _aten.clone.default):  # the export frontend may copy the expand before viewing it
        chain.append(expand)
        expand = expand.args[0]
    if _is_method(expand, "expand") and len(expand.args) == 6:
        times = expand.args[3]
    elif is_call(expand, _aten.expand.default) and len(expand.args[1]) == 5:
        times = expand.args[1][2]
    else:
        return Match.fail("the reshape does not follow a five-dimensional expand")
    new_axis = expand.args[0]
    if not (is_call(new_axis, operator.getitem) and new_axis.args[1] == _NEW_HEAD_AXIS
            or (_is_method(new_axis, "unsqueeze") or is_call(new_axis, _aten.unsqueeze.default)) and new_axis.args[1:] == (2,)):
        return Match.fail("the expand does not follow a new axis after the heads")
    if not isinstance(times, int) or times < 2:
        return Match.fail(f"the heads are repeated {times!r} times, no literal above 1")
    source = new_axis.args[0]
    if not isinstance(source, Node):
        return Match.fail("the repeated tensor is no node")
    return Match.ok(_Repeated(source, times, (*chain, expand, new_axis)))


def _is_method(node, name: str) -> bool:
    return isinstance(node, Node) and node.op == "call_method" and node.target == name


def _check_shapes(attention: Node, query, key: _Repeated, value: _Repeated, mask) -> str:
    """Why the recorded shapes rule the rewrite out ("" when they allow it)."""
    values = {name: tensor_val(node) for name, node in (("query", query), ("key", key.source), ("value", value.source))}
    if mask is not None:
        values["mask"] = tensor_val(mask)
    unknown = [name for name, val in values.items() if val is None]
    if unknown or tensor_val(attention) is None:
        return f"the {unknown[0] if unknown else 'output'} shape is unknown (no meta['val'])"
    if any(val.dim() != 4 for val in values.values()):
        return "its query, keys, values and mask are not all four-dimensional"
    # Imported here: torch's symbolic shapes (and sympy) take a second to import, which every aot command that reads
    # the pass registry would pay (a build restored from the cache included).
    from aot.compat.torch_private import statically_known_true

    heads = values["query"].shape[1]
    if not statically_known_true(heads == values["key"].shape[1] * key.times):
        return f"{heads} query heads are not {key.times} per key/value head"
    if not statically_known_true(values["key"].shape[1] == values["value"].shape[1]):
        return "its keys and values have different head counts"
    if mask is not None and not statically_known_true(values["mask"].shape[1] == 1):
        return f"its mask has {values['mask'].shape[1]} heads, not 1"
    return ""


def _other_reader(repeated: _Repeated, attention: Node) -> Node | None:
    """A node other than ``attention`` that reads the repeat, bar reads of the sizes repeating keeps."""
    last, *inner = repeated.nodes
    for node in inner:
        if len(node.users) != 1:
            return next(user for user in node.users if user not in repeated.nodes)
    for user in last.users:
        if user is attention or is_call(user, _aten.sym_size.int) and user.args[1] in _SIZES_KEPT:
            continue
        if not (is_call(user, getattr) and user.args[1:] == ("shape",)):
            return user
        for size in user.users:
            if not (is_call(size, operator.getitem) and size.args[1] in _SIZES_KEPT):
                return size
    return None


def _drop(graph, repeated: _Repeated) -> None:
    """Size reads move to the unrepeated source; then the repeat goes."""
    last = repeated.nodes[0]
    for user in list(last.users):
        user.replace_input_with(last, repeated.source)
    for node in repeated.nodes:
        if not node.users:
            graph.erase_node(node)
